"""Where a benchmark writes: a git-ignored folder, unless asked to update the stored results.

``benchmarks/results/`` holds the stored results: the JSON that ``tables.py`` turns into the
tables of ``benchmarks/README.md``, and the plots it shows. They change only when a run is
meant to replace them (``--update-stored``). Any other run writes to
``benchmarks/results/local/``, which git ignores, so running a benchmark leaves ``git status``
clean and the stored results as they were.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HERE = Path(__file__).resolve().parent
STORED = HERE / "results"
"""The stored results (tracked): what benchmarks/README.md shows."""
LOCAL = STORED / "local"
"""A run's own results (git-ignored): the default."""


def add_update_stored(parser: argparse.ArgumentParser) -> None:
    """The ``--update-stored`` flag: write to benchmarks/results/ instead of results/local/."""
    parser.add_argument(
        "--update-stored", action="store_true",
        help="write the stored results in benchmarks/results/ (what benchmarks/README.md "
             "shows; run tables.py afterwards) instead of benchmarks/results/local/ "
             "(git-ignored, the default)")


def results_dir(update_stored: bool) -> Path:
    """benchmarks/results/ with ``--update-stored``, else benchmarks/results/local/."""
    return STORED if update_stored else LOCAL


def default_help(name: str, what: str = "JSON output path") -> str:
    """The help text of an output option whose default file is ``name``."""
    return (f"{what} (default benchmarks/results/local/{name}; with --update-stored "
            f"benchmarks/results/{name})")


def add_output_options(parser: argparse.ArgumentParser, name: str, flag: str = "--json") -> None:
    """The output file option (``flag``, default results/local/``name``) and
    ``--update-stored``: what every benchmark that writes one JSON file takes."""
    parser.add_argument(flag, type=Path, default=None, help=default_help(name))
    add_update_stored(parser)


def output_file(args: argparse.Namespace, name: str, flag: str = "json") -> Path:
    """The file a run writes: the one given with ``--<flag>``, else ``name`` in
    results/local/ (results/ with ``--update-stored``)."""
    return getattr(args, flag) or results_dir(args.update_stored) / name


def write_result(path: Path, benchmark: str, argv: list[str] | None, started: float,
                 fields: dict) -> None:
    """Write a benchmark's JSON: ``fields`` and what every stored result records beside them
    (the command, the seconds since ``started`` on ``time.monotonic()``, torch, Python, the
    cores and the load average at the end), then say where."""
    import json
    import os
    import platform
    import sys
    import time

    import torch

    args = argv if argv is not None else sys.argv[1:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": benchmark, "command": " ".join([f"python benchmarks/{benchmark}.py", *args]),
        **fields, "seconds": round(time.monotonic() - started, 1), "torch": torch.__version__,
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "load_avg_after": os.getloadavg()}, indent=1))
    print(f"wrote {path}")
