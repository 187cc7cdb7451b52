"""``perfora convert FILE...``: print the diff, or write it (with a backup), or --check."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import PerforaError
from .api import convert_source
from .findings import ConversionResult


def backup_path(path: Path) -> Path:
    """``train.py.bak``, or ``train.py.bak.N`` when earlier backups exist (never overwritten)."""
    candidate = path.with_name(path.name + ".bak")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.bak.{n}")
        n += 1
    return candidate


def parse_settings(items: list[str] | None) -> dict[str, str]:
    """``--set NAME=VALUE`` options as a dict (a usage error without '=')."""
    settings: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise PerforaError(f"--set {item!r}: use --set NAME=VALUE, e.g. --set "
                               "max_dendrites=3")
        settings[name.strip()] = value
    return settings


def convert_file(path: Path, args: argparse.Namespace) -> ConversionResult:
    """Convert one file with the command line's options (nothing written)."""
    maximize = True if args.maximize else False if args.minimize else None
    return convert_source(path.read_text(), args.mode, settings=parse_settings(args.set),
                          run_dir=args.run_dir, save_name=args.save_name, score=args.score,
                          maximize=maximize, name=path.stem)


def run_convert(args: argparse.Namespace) -> int:
    """0: done (or nothing to change); 1: --check found changes to make; 2: an error."""
    if args.check and args.write:
        print("perfora convert: error: use --check or --write, not both", file=sys.stderr)
        return 2
    status = 0
    for name in args.files:
        path = Path(name)
        if not path.is_file():
            print(f"perfora convert: error: {name}: no such file", file=sys.stderr)
            status = 2
            continue
        try:
            result = convert_file(path, args)
        except PerforaError as exc:
            print(f"perfora convert: error: {name}: {exc}", file=sys.stderr)
            status = 2
            continue
        for finding in result.findings:
            print(finding.format(name), file=sys.stderr)
        if args.check:
            if result.changed:
                print(f"{name}: needs conversion ({args.mode} mode)", file=sys.stderr)
                status = max(status, 1)
            elif result.manual:
                print(f"{name}: needs changes by hand (the 'manual' lines above)",
                      file=sys.stderr)
                status = max(status, 1)
            continue
        if args.write:
            if result.changed:
                backup = backup_path(path)
                backup.write_text(result.source)
                path.write_text(result.output)
                print(f"{name}: converted ({args.mode} mode), original kept in {backup}",
                      file=sys.stderr)
            else:
                print(f"{name}: nothing to change", file=sys.stderr)
            continue
        sys.stdout.write(result.diff(name))
        manual = len(result.manual)
        if manual:
            print(f"{name}: {manual} part(s) to do by hand (the 'manual' lines above)",
                  file=sys.stderr)
    return status
