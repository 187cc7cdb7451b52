"""The `perfora` command line: `perfora demo`, `perfora launch`, `perfora convert`."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import PerforaError


def _demo(args: argparse.Namespace) -> int:
    from ..config_values import parse_overrides
    from .demo import format_table, grown_config, run_demo, run_files_line

    settings = parse_overrides(args.set)
    grown_config(settings)  # a bad --set is refused before the run folder is made
    if args.out:
        try:  # a clear usage error now, not a traceback once the first arm has trained
            Path(args.out).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            print(f"perfora demo: error: --out {args.out}: cannot create the run folder "
                  f"({reason}); give a folder you can write to, or --out '' for no files",
                  file=sys.stderr)
            return 2
    result = run_demo(seed=args.seed, out=args.out, hidden=args.hidden,
                      patience=args.patience, max_dendrites=args.max_dendrites,
                      growth=args.growth, settings=settings,
                      progress=not (args.json or args.no_progress) and _is_terminal(sys.stderr))
    if args.json:
        print(json.dumps(result))
    else:
        print()
        print(format_table(result))
        if args.out:
            print("\n" + run_files_line(result, args.out))
    return 0


def _is_terminal(stream: object) -> bool:
    """A progress bar redraws with carriage returns: thousands of lines in a log file."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _launch(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from .launch import LaunchSettings, launch

    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    try:
        settings = LaunchSettings(
            script=args.script, script_args=script_args, nproc_per_node=args.nproc_per_node,
            save_name=args.save_name, init=args.init, max_failures=args.max_failures,
            max_restarts=args.max_restarts, attempt_timeout=args.attempt_timeout,
            nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
            master_port=args.master_port)
    except ConfigError as exc:
        print(f"perfora launch: error: {exc}", file=sys.stderr)
        return 2
    return launch(settings).exit_code


def _convert(args: argparse.Namespace) -> int:
    try:
        import libcst  # noqa: F401
    except ImportError:
        print('perfora convert: error: the script converter needs libcst: '
              'pip install "perfora[convert]"', file=sys.stderr)
        return 2
    from .convert import run_convert

    return run_convert(args)


def _at_least(minimum: int, maximum: int = 2**63 - 1):
    """An argparse type: an integer in [minimum, maximum] (a clear usage error otherwise);
    the default maximum is the largest seed torch accepts."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value

    return parse


def version_line() -> str:
    """perfora's version with torch's and Python's, as a bug report wants them (read from the
    installed metadata, so ``--version`` stays instant)."""
    from importlib import metadata

    from .. import __version__

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    python = ".".join(map(str, sys.version_info[:3]))
    return f"perfora {__version__} (torch {torch_version}, Python {python})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfora", description=__doc__)
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="train a narrow MLP on digits: baseline, grown, and a plain network "
                     "of the grown size",
        description="Train a narrow MLP (64 -> H -> 10) on scikit-learn's digits (fixed "
                    "60/20/20 split): the baseline (early stopping), the same network grown "
                    "with perfora's defaults (dendrites and neurons, as the validation score "
                    "chooses; --growth picks one kind), and a plain network widened to the "
                    "grown size, early-stopped "
                    "with the same patience (wider) and trained as many epochs as the grown "
                    "run (wider-eq). Prints a table and the verdict 'grown vs a plain "
                    "network of the same size', and writes each "
                    "arm's run files under --out. Needs scikit-learn: "
                    "pip install \"perfora[demo]\".")
    demo.add_argument("--seed", type=_at_least(0), default=0, metavar="N",
                      help="random seed of the weights and the batch order (default %(default)s)")
    demo.add_argument("--out", default="perfora_runs/demo", metavar="DIR",
                      help="run folder (default %(default)s); '' writes no files")
    demo.add_argument("--json", action="store_true",
                      help="print the results as one JSON object instead of the table")
    demo.add_argument("--hidden", type=_at_least(1), default=6, metavar="H",
                      help="hidden width of the MLP (default %(default)s)")
    demo.add_argument("--patience", type=_at_least(1), default=10, metavar="P",
                      help="epochs without improvement before growing or stopping "
                           "(default %(default)s)")
    demo.add_argument("--max-dendrites", type=_at_least(0), default=3, metavar="K",
                      help="most dendrite sets to grow (default %(default)s)")
    demo.add_argument("--growth", choices=("auto", "dendrites", "neurons"), default="auto",
                      help="what the grown arm grows: both kinds, as the validation score "
                           "chooses (default), or one kind")
    demo.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                      help="a PerforaConfig setting for the grown arm, e.g. --set "
                           "dendrite_optimizer=auto (repeatable; values read as JSON where "
                           "they parse)")
    demo.add_argument("--no-progress", action="store_true",
                      help="hide the progress bar (hidden anyway when stderr is not a terminal)")
    demo.set_defaults(func=_demo)

    launch = sub.add_parser(
        "launch", help="run a training script under torchrun, restarting it after restructures",
        description="Run SCRIPT under torchrun (a fresh standalone rendezvous per attempt) with "
                    "--pai_load_folder NAME, and start it again each time it exits 0 without "
                    "writing NAME/.training_complete (it exited after a restructure) or fails "
                    "(up to --max-failures). Options after SCRIPT go to the script.")
    launch.add_argument("--nproc-per-node", "--nproc_per_node", type=int, required=True,
                        metavar="N", help="processes (ranks) per attempt")
    launch.add_argument("--save-name", default="PAI", metavar="NAME",
                        help="run folder the script writes switch_N checkpoints to and "
                             "resumes from (default PAI)")
    launch.add_argument("--init", action="store_true",
                        help="first run the script once in one process with "
                             "--perforate_model_parallel (the PerforatedAI recipe's "
                             "initialization run)")
    launch.add_argument("--max-failures", type=int, default=3, metavar="F",
                        help="failed attempts (non-zero exit) to restart before giving up "
                             "(default 3)")
    launch.add_argument("--max-restarts", type=int, default=100, metavar="R",
                        help="restarts after restructures before giving up (default 100)")
    launch.add_argument("--attempt-timeout", type=float, default=None, metavar="SECONDS",
                        help="stop an attempt that runs longer and count it as a failure")
    launch.add_argument("--nnodes", type=_at_least(1), default=1,
                        help="nodes in the job; run perfora launch on each (default 1)")
    launch.add_argument("--node-rank", "--node_rank", type=_at_least(0), default=0,
                        help="this node's index, 0 on the node at --master-addr")
    launch.add_argument("--master-addr", "--master_addr", default=None, metavar="ADDR",
                        help="node 0's address, reachable from every node (--nnodes > 1)")
    launch.add_argument("--master-port", "--master_port", type=_at_least(1, 65535),
                        default=None, metavar="PORT", help="a free port on node 0")
    launch.add_argument("script", help="the training script (.py)")
    script_args = launch.add_argument("script_args", nargs=argparse.REMAINDER,
                                      help="arguments for the script (optional)")
    script_args.required = False  # argparse counts a REMAINDER as required; it may be empty
    launch.set_defaults(func=_launch)

    convert = sub.add_parser(
        "convert", help="edit a training script for perfora (prints a diff)",
        description="Convert training scripts for perfora: print a unified diff (default), "
                    "apply it (--write, keeping FILE.bak) or only check (--check exits 1 when "
                    "a script needs changes). Parts too irregular to convert are left as they "
                    "are and reported as FILE:LINE: manual: what to do.")
    convert.add_argument("files", nargs="+", metavar="FILE", help="training script(s)")
    convert.add_argument("--mode", choices=("native", "compat"), default="native",
                         help="native: perfora's API, no restarts (default); compat: the "
                              "PerforatedAI recipe with perfora.compat's GPA/UPA names")
    convert.add_argument("--write", action="store_true",
                         help="change the files in place (the original goes to FILE.bak)")
    convert.add_argument("--check", action="store_true",
                         help="change nothing; exit 1 if a script needs conversion")
    convert.add_argument("--set", action="append", metavar="NAME=VALUE",
                         help="a setting for the generated code, e.g. --set max_dendrites=3 "
                              "(PerforaConfig names in native mode, GPA.pc names in compat "
                              "mode); repeatable")
    convert.add_argument("--run-dir", default=None, metavar="DIR",
                         help="native: the run folder (default perfora_runs/<script name>)")
    convert.add_argument("--save-name", default="PAI", metavar="NAME",
                         help="compat: save_name, the folder of switch_N.pt (default PAI)")
    convert.add_argument("--score", default=None, metavar="NAME",
                         help="the variable holding the validation score (default: found "
                              "from names like val_acc, val_loss)")
    convert.add_argument("--max-size", type=_at_least(0), default=None, metavar="BYTES",
                         help="refuse larger files (default 1000000, 1 MB; 0: no limit; "
                              "converting takes about 15 s and 1 GB of memory per MB)")
    direction = convert.add_mutually_exclusive_group()
    direction.add_argument("--maximize", action="store_true", help="higher score is better")
    direction.add_argument("--minimize", action="store_true", help="lower score is better")
    convert.set_defaults(func=_convert)
    return parser


def _subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)  # pragma: no cover - build_parser always adds the subcommands


def unrecognized_message(sub: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """'unrecognized arguments: ...', with the closest option for each unknown one."""
    options = [o for action in sub._actions for o in action.option_strings]
    guesses = []  # (what was typed, the closest option)
    for token in extras:
        typed = token.partition("=")[0]
        close = difflib.get_close_matches(typed, options, n=1) if typed.startswith("-") else []
        if close:
            guesses.append((typed, close[0]))
    if len(guesses) == 1:
        hint = f" (did you mean {guesses[0][1]}?)"
    elif guesses:
        hint = " (did you mean " + ", ".join(f"{c} for {t}" for t, c in guesses) + "?)"
    else:
        hint = ""
    return f"unrecognized arguments: {' '.join(extras)}{hint}"


_NPROC_FLAGS = ("--nproc-per-node", "--nproc_per_node")


def _nproc_after_script(argv: Sequence[str]) -> bool:
    """True when ``perfora launch`` got ``--nproc-per-node`` only after the script, where
    every option goes to the script (argparse would only say it is missing)."""
    if argv[:1] != ["launch"]:
        return False
    tokens, i = list(argv[1:]), 0
    while i < len(tokens) and tokens[i].startswith("-"):
        takes_value = tokens[i] not in ("--init", "-h", "--help") and "=" not in tokens[i]
        i += 2 if takes_value else 1
    def named(part: Sequence[str]) -> bool:
        return any(a in _NPROC_FLAGS or a.startswith(tuple(f + "=" for f in _NPROC_FLAGS))
                   for a in part)
    return not named(tokens[:i]) and named(tokens[i + 1:])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `perfora` command."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if _nproc_after_script(argv):
        _subcommand_parser(parser, "launch").error(
            "--nproc-per-node came after the script, so it went to the script: options for "
            "perfora launch go before SCRIPT, e.g. perfora launch --nproc-per-node 2 train.py "
            "--your-args")
    args, extras = parser.parse_known_args(argv)
    if extras:  # the subcommand's usage and its closest option, not the top-level usage
        sub = _subcommand_parser(parser, args.command)
        sub.error(unrecognized_message(sub, extras))
    try:
        return args.func(args)
    except PerforaError as exc:  # a typed, explained error: no traceback for the user
        print(f"perfora {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
