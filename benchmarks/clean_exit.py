"""Clean exits: how many torchrun jobs that load a grown run and end normally exit 0.

A user's script loads a grown perfora run on 3 gloo ranks (CPU), trains a step, and ends
with ``dist.barrier()`` and ``dist.destroy_process_group()``, returning normally (no
``os._exit``): ``tests/scripts/exits/grow_and_exit.py``. For FSDP2 and for DDP this grows one
run under ``torchrun`` and then launches the load-and-exit job ``--runs`` times, each with a
timeout, and counts the launches that did not exit 0, those that aborted (SIGABRT,
"terminate called ..."), and those that timed out.

    python benchmarks/clean_exit.py [--runs 20] [--ranks 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import output_paths

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPT = ROOT / "tests" / "scripts" / "exits" / "grow_and_exit.py"
OUTPUT = "clean_exit.json"
KINDS = ("fsdp2", "ddp")
ABORT_SIGNS = ("terminate called", "SIGABRT", "exitcode  : -6")


def _allow_core_dumps() -> None:
    """In the launched torchrun (and so its ranks): core files allowed, for a backtrace."""
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def launch(mode: str, kind: str, run_dir: Path, ranks: int, timeout_s: float,
           cores: bool = False) -> dict:
    """One ``torchrun`` of the script; its exit code, seconds, and how it ended.

    It runs in a folder of its own beside ``run_dir``, where a rank's core file lands with
    ``cores`` (a kernel ``core_pattern`` of plain ``core``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(ranks), "--max-restarts", "0", str(SCRIPT), mode, str(run_dir)]
    if kind == "ddp":
        cmd.append("--ddp")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cwd = run_dir.parent / f"launch_{len(list(run_dir.parent.glob('launch_*')))}"
    cwd.mkdir()
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout_s,
                              preexec_fn=_allow_core_dumps if cores else None)
        code, log = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, log = None, (exc.stdout or b"").decode() + (exc.stderr or b"").decode()
    seconds = time.monotonic() - start
    aborted = any(sign in log for sign in ABORT_SIGNS)
    return {"mode": mode, "kind": kind, "exit_code": code, "seconds": round(seconds, 2),
            "aborted": aborted, "timed_out": code is None, "folder": cwd.name,
            "log_tail": "" if code == 0 else log[-3000:]}


def grow(kind: str, folder: Path, ranks: int, timeout_s: float) -> Path:
    """Grow one run of ``kind`` under torchrun (it must succeed); its run folder."""
    run_dir = folder / f"run_{kind}"
    result = launch("grow", kind, run_dir, ranks, timeout_s)
    if result["exit_code"] != 0 or not (run_dir / "grow_result.json").is_file():
        raise RuntimeError(f"growing the {kind} run failed:\n{result['log_tail']}")
    if json.loads((run_dir / "grow_result.json").read_text())["dendrites"] < 1:
        raise RuntimeError(f"the {kind} run did not grow")
    return run_dir


def load_and_exit(kind: str, run_dir: Path, runs: int, ranks: int,
                  timeout_s: float, cores: bool = False) -> list[dict]:
    """``runs`` launches that load ``run_dir``, train a step and end normally."""
    results = []
    for _ in range(runs):
        (run_dir / "load_result.json").unlink(missing_ok=True)
        result = launch("load", kind, run_dir, ranks, timeout_s, cores)
        loaded = run_dir / "load_result.json"
        result["loaded_dendrites"] = (json.loads(loaded.read_text())["dendrites"]
                                      if loaded.is_file() else None)
        results.append(result)
    return results


def summarize(kind: str, results: list[dict]) -> dict:
    """One row: launches, clean exits, aborts, timeouts, other failures, median seconds."""
    return {"kind": kind, "runs": len(results),
            "exit_0": sum(r["exit_code"] == 0 for r in results),
            "aborted": sum(r["aborted"] for r in results),
            "timed_out": sum(r["timed_out"] for r in results),
            "other_failures": sum(r["exit_code"] != 0 and not r["aborted"]
                                  and not r["timed_out"] for r in results),
            "median_s": round(statistics.median(r["seconds"] for r in results), 2)}


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="load-and-exit launches per kind")
    ap.add_argument("--ranks", type=int, default=3, help="ranks per launch")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--timeout-s", type=float, default=180.0, help="per launch")
    ap.add_argument("--keep", type=Path, default=None,
                    help="work in this (new) folder and keep it: the runs, each launch's "
                         "folder and, where the kernel writes them there, core files")
    output_paths.add_output_options(ap, OUTPUT, "--json")
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --json, else results/local/ (results/ with --update-stored)."""
    return output_paths.output_file(args, OUTPUT, "json")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    rows, launches = [], []
    if args.keep is not None:
        args.keep.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="perfora-exit-") as tmp:
        work = args.keep or Path(tmp)
        for kind in args.kinds:
            print(f"{kind}: growing a run, then {args.runs} load-and-exit launches on "
                  f"{args.ranks} ranks ...", flush=True)
            (work / kind).mkdir()
            run_dir = grow(kind, work / kind, args.ranks, args.timeout_s)
            results = load_and_exit(kind, run_dir, args.runs, args.ranks, args.timeout_s,
                                    cores=args.keep is not None)
            rows.append(summarize(kind, results))
            launches += results
    print(f"{'kind':>6} {'runs':>5} {'exit 0':>7} {'aborted':>8} {'timed out':>10} "
          f"{'other':>6} {'median s':>9}")
    for r in rows:
        print(f"{r['kind']:>6} {r['runs']:>5} {r['exit_0']:>7} {r['aborted']:>8} "
              f"{r['timed_out']:>10} {r['other_failures']:>6} {r['median_s']:>9.1f}")
    for r in launches:
        if r["exit_code"] != 0:
            print(f"--- {r['kind']} launch failed (exit {r['exit_code']}):\n{r['log_tail']}")
    import torch

    path = output_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": "clean_exit", "command": "python benchmarks/clean_exit.py "
        + " ".join(argv if argv is not None else sys.argv[1:]), "ranks": args.ranks,
        "rows": rows, "launches": launches, "torch": torch.__version__,
        "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "load_avg_after": os.getloadavg()}, indent=1))
    print(f"wrote {path}")
    return 0 if all(r["exit_0"] == r["runs"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
