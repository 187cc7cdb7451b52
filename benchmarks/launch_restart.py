"""What a restart costs under `perfora launch`: torchrun's agent forked against started afresh.

Each attempt of `perfora launch` runs torchrun's agent, which starts the ranks. The launcher
forks that agent from itself (torch already imported) when it runs no other thread, and
otherwise starts ``python -m torch.distributed.run`` afresh (its torch import, about 2 s of
CPU, at every attempt). This runs the same job both ways, side by side and interleaved:
a 2-rank job that joins a gloo group, all-reduces once and exits as after a restructure,
``--attempts`` times, the last time writing ``.training_complete``. The fresh arm is the
same ``perfora launch`` command with one idle thread started in the launcher first, which
is what makes it start torchrun afresh.

    python benchmarks/launch_restart.py [--reps 3] [--attempts 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from output_paths import add_output_options, output_file, write_result

OUTPUT = "launch_restart.json"
ROOT = Path(__file__).resolve().parents[1]
ARMS = ("forked", "fresh")

JOB = '''
import os, sys
from pathlib import Path
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
save = Path("PAI")
if dist.get_rank() == 0:
    save.mkdir(exist_ok=True)
    done = len(list(save.glob("attempt_*")))
    (save / f"attempt_{done + 1}").write_text(str(t.item()))  # progress: a new file
    if done + 1 >= int(sys.argv[1]):
        (save / ".training_complete").write_text("")
dist.barrier()
dist.destroy_process_group()
'''

LAUNCHER = '''
import sys, threading
if sys.argv[1] == "fresh":  # a launcher running another thread starts torchrun afresh
    threading.Thread(target=threading.Event().wait, daemon=True).start()
from perfora.cli import main
sys.exit(main(sys.argv[2:]))
'''


def run_once(arm: str, attempts: int, folder: Path, timeout_s: float) -> dict:
    """One `perfora launch` of the job in a new launcher process: its wall time and outcome."""
    folder.mkdir(parents=True)
    (folder / "job.py").write_text(JOB)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-c", LAUNCHER, arm, "launch", "--nproc-per-node", "2",
           "--attempt-timeout", str(timeout_s), "job.py", str(attempts)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=timeout_s * (attempts + 1))
    seconds = time.perf_counter() - start
    done = f"after {attempts} attempt(s)" in proc.stdout
    return {"arm": arm, "seconds": round(seconds, 2), "exit_code": proc.returncode,
            "completed": done and proc.returncode == 0,
            "log_tail": "" if done else (proc.stdout + proc.stderr)[-1500:]}


def summarize(runs: list[dict], attempts: int) -> list[dict]:
    """Per arm: median wall time of a launch and per attempt, the spread, the failures."""
    rows = []
    for arm in ARMS:
        times = [r["seconds"] for r in runs if r["arm"] == arm and r["completed"]]
        failed = sum(1 for r in runs if r["arm"] == arm and not r["completed"])
        median = statistics.median(times) if times else float("nan")
        rows.append({"arm": arm, "launches": len(times), "failed": failed,
                     "median_s": round(median, 2), "per_attempt_s": round(median / attempts, 2),
                     "min_s": min(times, default=float("nan")),
                     "max_s": max(times, default=float("nan"))})
    forked, fresh = rows[0]["median_s"], rows[1]["median_s"]
    rows[0]["fresh_over_forked"] = rows[1]["fresh_over_forked"] = round(fresh / forked, 2)
    return rows


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --json, else results/local/ (results/ with --update-stored)."""
    return output_file(args, OUTPUT)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="launches per arm (default 3)")
    ap.add_argument("--attempts", type=int, default=3,
                    help="attempts per launch: restarts + 1 (default 3)")
    ap.add_argument("--timeout-s", type=float, default=120.0,
                    help="each attempt's --attempt-timeout (default 120)")
    add_output_options(ap, OUTPUT)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.reps < 1 or args.attempts < 1:
        ap.error("--reps and --attempts must be at least 1")
    if not args.timeout_s > 0:
        ap.error(f"--timeout-s must be a positive number of seconds, got {args.timeout_s}")
    runs = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="perfora-launch-restart-") as tmp:
        for rep in range(args.reps):
            for arm in ARMS if rep % 2 == 0 else ARMS[::-1]:  # interleaved, order alternated
                run = run_once(arm, args.attempts, Path(tmp, f"{arm}{rep}"), args.timeout_s)
                print(f"rep {rep + 1}/{args.reps} {arm:>6}: {run['seconds']:6.2f} s"
                      + ("" if run["completed"] else f" FAILED\n{run['log_tail']}"), flush=True)
                runs.append(run)
    rows = summarize(runs, args.attempts)
    print(f"\n{args.attempts} attempts per launch, 2 ranks, {args.reps} launches per arm")
    print(f"{'agent':>7} {'launches':>9} {'failed':>7} {'median s':>9} {'per attempt':>12} "
          f"{'fresh/forked':>13}")
    for r in rows:
        print(f"{r['arm']:>7} {r['launches']:>9} {r['failed']:>7} {r['median_s']:>9.2f} "
              f"{r['per_attempt_s']:>12.2f} {r['fresh_over_forked']:>13.2f}")
    write_result(output_path(args), "launch_restart", argv, start,
                 {"rows": rows, "runs": runs, "attempts": args.attempts, "reps": args.reps})
    return 0 if all(r["completed"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
