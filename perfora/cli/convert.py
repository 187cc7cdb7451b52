"""``perfora convert FILE...``: print the diff, or write it (with a backup), or --check."""

from __future__ import annotations

import argparse
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from ..codemod.api import convert_source
from ..codemod.findings import CodemodResult
from ..errors import PerforaError

MAX_SIZE = 1_000_000
"""Largest script (bytes) converted without ``--max-size``: libcst's syntax tree of a 1 MB
script takes about 15 s and 1 GB to build and read (``benchmarks/convert_size.py``)."""


class ReadError(PerforaError):
    """A FILE argument that is not a readable Python script (exit 2)."""


@dataclass
class Script:
    """A script as read from disk: its text (newlines as ``\\n``), encoding and bytes."""

    text: str
    encoding: str
    raw: bytes


_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=]", re.M)  # PEP 263's declaration


def read_script(path: Path, max_size: int = MAX_SIZE) -> Script:
    """Read a script as Python does (PEP 263 coding declaration, UTF-8 by default).

    Raises :class:`ReadError` for a directory, a missing, binary, undecodable or too large
    file, with what to do instead.
    """
    if path.is_dir():
        scripts = sorted((p.name for p in path.glob("*.py") if p.is_file()),
                         key=lambda n: ("train" not in n.lower(), n))  # train*.py first
        hint = (f" (Python files in it: {', '.join(scripts[:5])}"
                f"{', ...' if len(scripts) > 5 else ''})" if scripts else " (no .py files in it)")
        raise ReadError(f"is a directory, not a script: pass the training script(s) in it, "
                        f"e.g. perfora convert {path / (scripts[0] if scripts else 'train.py')}"
                        f"{hint}")
    if not path.is_file():
        raise ReadError("no such file")
    size = path.stat().st_size
    if max_size and size > max_size:
        raise ReadError(f"{size:,} bytes, over the {max_size:,}-byte limit for a training "
                        "script (converting takes about 15 s and 1 GB of memory per MB); is "
                        "this the right file? --max-size BYTES raises the limit (0: none)")
    raw = path.read_bytes()
    if b"\0" in raw:
        raise ReadError("a binary file (it contains NUL bytes), not a Python script")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:
        if _CODING.search(b"\n".join(raw.split(b"\n", 2)[:2])):
            raise ReadError(f"{exc.msg}: fix the coding declaration on its first two lines "
                            "(e.g. # -*- coding: utf-8 -*-)") from None
        encoding = "utf-8"  # no declaration, just bytes that are not UTF-8: said below
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        byte = raw[exc.start:exc.start + 1].hex()
        raise ReadError(f"not {encoding} text (byte 0x{byte} on line {line}): Python reads a "
                        f"script as UTF-8 unless it declares another encoding; save it as "
                        f"UTF-8, or declare its encoding on its first or second line, e.g. "
                        f"# -*- coding: latin-1 -*-") from None
    # newlines as open() reads them; --write writes \n line ends in the script's encoding
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return Script(text, encoding, raw)


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
        if name.strip() == "maximize":
            raise PerforaError(f"--set {item!r}: the direction has its own options, --maximize "
                               "(a higher score is better) and --minimize (a loss)")
        settings[name.strip()] = value
    return settings


def max_size_of(args: argparse.Namespace) -> int:
    """``--max-size`` (bytes; 0: no limit), :data:`MAX_SIZE` when not given."""
    value = getattr(args, "max_size", None)
    return MAX_SIZE if value is None else value


def convert_file(path: Path, args: argparse.Namespace,
                 script: Script | None = None) -> CodemodResult:
    """Convert one file with the command line's options (nothing written)."""
    if script is None:
        script = read_script(path, max_size_of(args))
    maximize = True if args.maximize else False if args.minimize else None
    return convert_source(script.text, args.mode, settings=parse_settings(args.set),
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
        try:
            script = read_script(path, max_size_of(args))
            result = convert_file(path, args, script)
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
                backup.write_bytes(script.raw)  # the original, byte for byte
                path.write_bytes(result.output.encode(script.encoding))
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
