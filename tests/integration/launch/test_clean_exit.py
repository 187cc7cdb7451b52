"""A user's torchrun job that loads a grown run (FSDP2 or DDP) and ends with ``barrier()`` and
``destroy_process_group()`` exits 0: no abort at interpreter exit, no ``os._exit`` needed.

The first test's jobs are ``tests/scripts/exits/grow_and_exit.py`` on 3 gloo ranks, launched by
``benchmarks/clean_exit.py``'s helpers; the growing job ends the same way. The benchmark runs
80 launches per kind (docs/distributed.md, "Ending a job", says how many exited 0 and why a
job could abort before perfora's exit handler); this test runs a few, since each launch costs
the job's imports on 3 ranks. The second launches the Fabric loop of
``tests/scripts/trainers/train_fabric.py``, whose model is a local of ``main()``, 6 times.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from clean_exit import grow, load_and_exit  # noqa: E402

RANKS, LOADS, TIMEOUT_S = 3, 2, 120


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("kind", ["fsdp2", "ddp"])
def test_jobs_that_grow_or_load_a_run_and_destroy_the_group_exit_0(tmp_path, kind):
    run_dir = grow(kind, tmp_path, RANKS, TIMEOUT_S)  # raises unless the job exited 0
    for launch in load_and_exit(kind, run_dir, LOADS, RANKS, TIMEOUT_S):
        assert launch["exit_code"] == 0 and not launch["aborted"], launch["log_tail"]
        assert launch["loaded_dendrites"] == 1  # the grown structure was loaded


FABRIC_SCRIPT = ROOT / "tests" / "scripts" / "trainers" / "train_fabric.py"
JOBS, AT_ONCE, JOB_TIMEOUT_S = 6, 3, 90


def _start_fabric_job(out: Path) -> subprocess.Popen:
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "--max-restarts", "0", str(FABRIC_SCRIPT), str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(cmd, env=env, stdout=(out / "log").open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fabric_jobs_whose_model_dies_with_main_exit_0(tmp_path):
    # the script grows in a Fabric DDP loop inside main(), ends with barrier() and
    # destroy_process_group(), and returns: the DDP wrapper is freed with main()'s locals.
    # Before perfora kept the process group referenced, its reducer could destroy the group
    # while a gloo thread waited for the GIL: 6 of 48 such jobs hung at 6 jobs at once on a
    # 2-core machine (and 7 of 36 of the same loop without perfora); 3 at a time load it here
    pytest.importorskip("lightning.fabric")
    pending = [tmp_path / f"job{i}" for i in range(JOBS)]
    running: dict[Path, tuple[subprocess.Popen, float]] = {}
    ended: dict[Path, int | None] = {}
    while pending or running:
        while pending and len(running) < AT_ONCE:
            out = pending.pop(0)
            running[out] = (_start_fabric_job(out), time.monotonic())
        time.sleep(0.2)
        for out, (proc, start) in list(running.items()):
            if proc.poll() is not None or time.monotonic() - start > JOB_TIMEOUT_S:
                if proc.poll() is None:  # hung: stop the job and its ranks
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    ended[out] = None
                else:
                    ended[out] = proc.returncode
                del running[out]
    failed = {out.name: code for out, code in ended.items() if code != 0}
    assert not failed, (f"jobs that did not exit 0 (None: hung) {failed}:\n"
                        + (tmp_path / next(iter(failed)) / "log").read_text()[-2000:])
    for out in ended:  # each rank finished its growth run before the exit
        results = [json.loads((out / f"result_{r}.json").read_text()) for r in range(2)]
        assert results[0]["digest"] == results[1]["digest"]
