"""The `perfora` command line: `perfora demo`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from .demo import format_table, run_demo

    result = run_demo(seed=args.seed, out=args.out, hidden=args.hidden,
                      patience=args.patience, max_dendrites=args.max_dendrites,
                      progress=not args.json and not args.no_progress)
    if args.json:
        print(json.dumps(result))
    else:
        print()
        print(format_table(result))
        if args.out:
            print(f"\nrun files (metrics.csv, best_arch_scores.csv, history.png, checkpoints) "
                  f"in {args.out}/baseline and {args.out}/dendrites")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfora", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a narrow MLP on digits: baseline vs dendrites")
    demo.add_argument("--seed", type=int, default=0, help="seed of weights and batch order")
    demo.add_argument("--out", default="perfora_runs/demo",
                      help="run folder (default perfora_runs/demo); '' writes no files")
    demo.add_argument("--json", action="store_true", help="print the table as one JSON object")
    demo.add_argument("--hidden", type=int, default=6, help="hidden width of the MLP")
    demo.add_argument("--patience", type=int, default=10, help="epochs without improvement")
    demo.add_argument("--max-dendrites", type=int, default=3, help="cap on dendrite sets")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `perfora` command."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
