"""A user's torchrun job that loads a grown FSDP2 run and ends with ``barrier()`` and
``destroy_process_group()`` exits 0: no abort at interpreter exit, no ``os._exit`` needed.

The first test's jobs are ``tests/scripts/exits/grow_and_exit.py`` on 2 gloo ranks, launched by
``benchmarks/clean_exit.py``'s helpers; the growing job ends the same way. The benchmark runs
80 launches per kind (DDP and FSDP2) on 3 ranks (docs/distributed.md, "Ending a job", says how
many exited 0 and why a job could abort before perfora's exit handler); this test runs one of
each job on 2, since each launch costs the job's imports on every rank. DDP jobs that load a
grown run and end this way are the ``perfora launch`` tests' (each attempt after a restructure
loads one), which require exit code 0 from every rank too. The second test launches the Fabric
loop of ``tests/scripts/trainers/train_fabric.py``, whose model is a local of ``main()``,
twice at once (``benchmarks/fabric_exit.py`` runs many more).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from clean_exit import grow, load_and_exit  # noqa: E402
from fabric_exit import SCRIPTS as FABRIC_SCRIPTS  # noqa: E402
from fabric_exit import run_launches  # noqa: E402

RANKS, LOADS, TIMEOUT_S = 2, 1, 120


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fsdp2_jobs_that_grow_or_load_a_run_and_destroy_the_group_exit_0(tmp_path):
    run_dir = grow("fsdp2", tmp_path, RANKS, TIMEOUT_S)  # raises unless the job exited 0
    for launch in load_and_exit("fsdp2", run_dir, LOADS, RANKS, TIMEOUT_S):
        assert launch["exit_code"] == 0 and not launch["aborted"], launch["log_tail"]
        assert launch["loaded_dendrites"] == 1  # the grown structure was loaded


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fabric_jobs_whose_model_dies_with_main_exit_0(tmp_path):
    # tests/scripts/trainers/train_fabric.py grows in a Fabric DDP loop inside main(), ends
    # with barrier() and destroy_process_group(), and returns: the DDP wrapper is freed with
    # main()'s locals. Before perfora kept the process group referenced, its reducer could
    # destroy the group while a gloo thread waited for the GIL, and the job hung
    # (benchmarks/fabric_exit.py measures how often); 2 launches at a time, beside the other
    # pytest worker, load the machine
    pytest.importorskip("lightning.fabric")
    results = run_launches(FABRIC_SCRIPTS["perfora"], tmp_path, launches=2, at_once=2,
                           timeout_s=120)
    failed = [r for r in results if r["exit_code"] != 0]
    assert not failed, (f"launches that did not exit 0 (None: hung) {failed}:\n"
                        + (tmp_path / f"launch{failed[0]['launch']}" / "log").read_text()[-2000:])
    for r in results:  # both ranks finished the growth run, bit-identical
        out = tmp_path / f"launch{r['launch']}"
        digests = {json.loads((out / f"result_{k}.json").read_text())["digest"] for k in (0, 1)}
        assert len(digests) == 1
