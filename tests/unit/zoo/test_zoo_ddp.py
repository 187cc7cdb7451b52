"""Zoo models under DistributedDataParallel on 2 real CPU ranks (gloo), as torchrun starts
them (tests/scripts/zoo/ddp_grow.py): a transformer (GPT-2, its Conv1D layers) and a CNN
with batch norm (ResNet). The ranks start from different weights, train on different data
and grow with different seeds; after growth and a few steps every parameter is identical
on both ranks, and growth leaves the output unchanged."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from tests.support.paths import SCRIPTS  # noqa: E402
from tests.support.two_ranks import run_two_ranks  # noqa: E402

SCRIPT = SCRIPTS / "zoo" / "ddp_grow.py"


@pytest.mark.timeout(300)
def test_zoo_models_grow_under_ddp_with_ranks_identical(tmp_path, script_server):
    ranks = run_two_ranks(script_server, SCRIPT, tmp_path, timeout=240)
    assert set(ranks[0]) == {"gpt2", "hf-resnet"}
    for name in ranks[0]:
        r0, r1 = (r[name] for r in ranks)
        assert r0["unchanged"], name  # new dendrites start silent
        assert r0["outputs_agree"], name
        for r in (r0, r1):
            assert r["new_wrapper"] and r["dendrites"] == [1], name
            assert r["diff_at_growth"] == 0.0 and r["diff_after"] == 0.0, name
            assert all(torch.isfinite(torch.tensor(r["losses"]))), name
        # each rank trained on its own data: the losses differ, the parameters do not
        assert r0["losses"] != r1["losses"], name
