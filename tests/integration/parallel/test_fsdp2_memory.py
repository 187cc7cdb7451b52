"""Shard-local restructures under FSDP2: peak memory per rank on 2 real gloo ranks.

The ranks run ``benchmarks/restructure_memory.py``'s measurement (peak resident memory
above the process before the model, in fresh processes whose allocator returns freed
tensors at once) on an MLP of 8 x 1024^2 layers with Adam: large enough that gathering
the whole model for a restructure, as FSDP1 still does, shows above the bound.
"""

from __future__ import annotations

import sys

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from restructure_memory import OPERATIONS, TARGET, measure, ratios  # noqa: E402

# both runs are shared by the tests here: keep them on one pytest-xdist worker
pytestmark = pytest.mark.xdist_group("fsdp2_memory")

WIDTH, LAYERS = 1024, 8


@pytest.fixture(scope="session")  # kept for the whole run: another module may run in between
def runs() -> dict[str, list[dict]]:
    return {mode: measure(mode, WIDTH, LAYERS) for mode in ("shard-local", "gather")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_growth_snapshot_and_rewind_stay_within_the_steady_state_bound(runs):
    for result in runs["shard-local"]:
        r = ratios(result)
        assert all(r[op] <= TARGET for op in OPERATIONS), (result["rank"], r)
        # growth leaves the outputs unchanged; the rewind gives back the best model exactly
        assert result["out_change"] == 0.0 and result["rewind_change"] == 0.0
        assert result["dendrites_after_rewind"] == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_model_is_large_enough_that_a_full_gather_would_exceed_the_bound(runs):
    # the negative control: the same steps with every tensor gathered whole on every rank
    assert any(ratios(result)["rewind"] > TARGET for result in runs["gather"])
    for local, gathered in zip(runs["shard-local"], runs["gather"]):
        assert local["peaks"]["grow"] < gathered["peaks"]["grow"]
        assert local["peaks"]["rewind"] < gathered["peaks"]["rewind"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_shard_local_growth_gives_the_values_a_full_gather_gives(runs):
    digests = {result["grown"] for mode in runs.values() for result in mode}
    assert len(digests) == 1  # every rank, both ways: bit for bit the same grown model
