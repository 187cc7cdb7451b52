"""Run converted training scripts as ``__main__`` in forked processes (a test helper).

``python tests/convert_runner.py JOBS.json RESULTS.json`` imports torch, perfora and
matplotlib once, then for each job forks one process per rank that changes into the job's
folder, sets its environment (torchrun's variables for 2 ranks: RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), writes stdout and stderr to ``rank<N>.log`` and runs
the script with ``runpy`` as ``__main__`` with the job's argv. Every rank is its own
process, as under torchrun; only the ~3 s of imports per process are shared, which keeps the
corpus runs inside the test-suite budget. The runner itself does no tensor work and starts no
threads before forking. A job that runs past its timeout is killed (exit code -9).
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback

os.environ.setdefault("MPLBACKEND", "Agg")

import matplotlib.pyplot  # noqa: E402,F401  (imported once, before forking)
import torch  # noqa: E402,F401
import torch.distributed  # noqa: E402,F401

import perfora  # noqa: E402,F401
import perfora.compat  # noqa: E402,F401


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child(job: dict, rank: int, port: int) -> None:
    """In the forked process: run the script as __main__; never returns."""
    code = 1
    try:
        os.chdir(job["cwd"])
        os.environ.update(job.get("env", {}))
        if job["ranks"] > 1:
            os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank),
                               "WORLD_SIZE": str(job["ranks"]),
                               "LOCAL_WORLD_SIZE": str(job["ranks"]),
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        log = os.open(f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        sys.stdin.close()
        sys.argv = [job["script"], *job.get("argv", [])]
        try:
            runpy.run_path(job["script"], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        except BaseException:  # noqa: B036 - report anything, as a crashed script would
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def run_job(job: dict) -> list[int]:
    """Fork the job's ranks and wait for them (killed after the timeout); their exit codes."""
    port = free_port()
    pids = []
    for rank in range(job["ranks"]):
        pid = os.fork()
        if pid == 0:
            child(job, rank, port)
        pids.append(pid)
    codes: dict[int, int] = {}
    deadline = time.monotonic() + job["timeout"]
    while len(codes) < len(pids):
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in pids:
                if pid not in codes:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes[pid] = -9
        time.sleep(0.05)
    return [codes[pid] for pid in pids]


def main() -> None:
    jobs = json.loads(open(sys.argv[1]).read())
    results = {job["id"]: run_job(job) for job in jobs}
    with open(sys.argv[2], "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main()
