"""Hangs at exit: how many Fabric DDP launches whose model dies with ``main()`` exit 0.

Each launch is ``torchrun --nproc-per-node 2`` of a Lightning Fabric DDP loop written as a
user's script: the model is a local of ``main()``, which ends with ``barrier()`` and
``destroy_process_group()`` and returns. ``--launches`` of them run, ``--at-once`` at a time
(the load makes a late gloo thread likely); a launch still running after ``--timeout-s`` is
counted as hung and killed. ``perfora`` is ``tests/scripts/trainers/train_fabric.py`` (it
grows in the loop); ``plain`` is the same loop without perfora
(``tests/scripts/exits/fabric_without_perfora.py``). docs/distributed.md, "Ending a job",
says why such a launch could hang and what perfora does about it.

    python benchmarks/fabric_exit.py [--scripts perfora plain] [--launches 36] [--at-once 6]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import output_paths

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS = {"perfora": ROOT / "tests" / "scripts" / "trainers" / "train_fabric.py",
           "plain": ROOT / "tests" / "scripts" / "exits" / "fabric_without_perfora.py"}
OUTPUT = "fabric_exit.json"


def _start(script: Path, out: Path) -> subprocess.Popen:
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "--max-restarts", "0", str(script), str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(cmd, env=env, stdout=(out / "log").open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its ranks in sessions of their own, so
    killing its session leaves them running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _kill_launch(proc: subprocess.Popen) -> None:
    """Stop a hung launch: torchrun and every rank it started."""
    for pid in [proc.pid, *_descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run_launches(script: Path, work: Path, launches: int, at_once: int,
                 timeout_s: float) -> list[dict]:
    """Every launch's exit code (None: hung, killed) and seconds, ``at_once`` at a time."""
    pending = list(range(launches))
    running: dict[int, tuple[subprocess.Popen, float]] = {}
    results: list[dict] = []
    while pending or running:
        while pending and len(running) < at_once:
            index = pending.pop(0)
            running[index] = (_start(script, work / f"launch{index}"), time.monotonic())
        time.sleep(0.2)
        for index, (proc, start) in list(running.items()):
            seconds = time.monotonic() - start
            if proc.poll() is None and seconds <= timeout_s:
                continue
            code = proc.poll()
            if code is None:
                _kill_launch(proc)
            results.append({"launch": index, "exit_code": code, "seconds": round(seconds, 2)})
            del running[index]
            print(f"  launch {index}: " + ("hung (killed)" if code is None
                                           else f"exit {code}"), flush=True)
    return sorted(results, key=lambda r: r["launch"])


def summarize(name: str, results: list[dict]) -> dict:
    """One row: launches, clean exits, hangs, other failures."""
    return {"script": name, "launches": len(results),
            "exit_0": sum(r["exit_code"] == 0 for r in results),
            "hung": sum(r["exit_code"] is None for r in results),
            "other_failures": sum(r["exit_code"] not in (0, None) for r in results)}


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scripts", nargs="+", choices=list(SCRIPTS), default=list(SCRIPTS))
    ap.add_argument("--launches", type=int, default=36, help="launches per script")
    ap.add_argument("--at-once", type=int, default=6, help="launches running together")
    ap.add_argument("--timeout-s", type=float, default=60.0,
                    help="per launch; a launch still running then counts as hung")
    output_paths.add_output_options(ap, OUTPUT, "--json")
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --json, else results/local/ (results/ with --update-stored)."""
    return output_paths.output_file(args, OUTPUT, "json")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.launches < 1 or args.at_once < 1:
        ap.error("--launches and --at-once must be at least 1")
    try:
        import lightning.fabric  # noqa: F401
    except ImportError:
        ap.error('needs Lightning Fabric: pip install -e ".[lightning]"')
    rows, launches = [], {}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="perfora-fabric-exit-") as tmp:
        for name in args.scripts:
            print(f"{name}: {args.launches} launches, {args.at_once} at a time ...", flush=True)
            results = run_launches(SCRIPTS[name], Path(tmp) / name, args.launches,
                                   args.at_once, args.timeout_s)
            rows.append(summarize(name, results))
            launches[name] = results
    print(f"{'script':>8} {'launches':>9} {'exit 0':>7} {'hung':>5} {'other':>6}")
    for r in rows:
        print(f"{r['script']:>8} {r['launches']:>9} {r['exit_0']:>7} {r['hung']:>5} "
              f"{r['other_failures']:>6}")
    output_paths.write_result(output_path(args), "fabric_exit", argv, start, {
        "rows": rows, "launches": launches, "at_once": args.at_once,
        "timeout_s": args.timeout_s})
    return 0


if __name__ == "__main__":
    sys.exit(main())
