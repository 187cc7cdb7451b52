"""A user's torchrun job that loads a grown run (FSDP2 or DDP) and ends with ``barrier()`` and
``destroy_process_group()`` exits 0: no abort at interpreter exit, no ``os._exit`` needed.

The jobs are ``tests/scripts/exits/grow_and_exit.py`` on 3 gloo ranks, launched by
``benchmarks/clean_exit.py``'s helpers; the growing job ends the same way. The benchmark runs
80 launches per kind (docs/distributed.md, "Ending a job", says how many exited 0 and why a
job could abort before perfora's exit handler); this test runs a few, since each launch costs
the job's imports on 3 ranks.
"""

from __future__ import annotations

import sys

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
