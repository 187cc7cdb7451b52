"""Neuron growth in a fused gate-and-up MLP (Phi-3's layout) under DDP, FSDP2 and FSDP1: 2 real
CPU ranks (gloo), each on its own data. Each step gives the fused layer a gate row and an up
row per neuron (under the sharded backends one layer pair gathered at a time), keeps the
output bit for bit and the ranks' parameters identical, and the rewind to the narrow best
model shrinks it back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import perfora
from tests.support.ranks import run_in_folder, wrapped_for
from tests.support.widening import FusedGatedMLP, grow_twice_and_rewind

WORLD = 2


def grow_fused(rank: int, tmp: Path, kind: str) -> dict:
    torch.manual_seed(0)
    base = perfora.perforate(nn.Sequential(nn.Linear(4, 8), FusedGatedMLP(8, 16),
                                           nn.Linear(8, 3)))
    model = wrapped_for(kind, base, WORLD)
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=2, neurons_per_step=0.5,
                                   write_files=False)
    rows: list[int] = []
    run = grow_twice_and_rewind(
        model, ctl, rank, torch.randn(4, 4, generator=torch.Generator().manual_seed(9)), (),
        lambda m: rows.append(ctl.backend.full_state(m)["1.gate_up_proj.base.weight"].shape[0]))
    params = {k: v.tolist() for k, v in ctl.backend.full_state(run["model"]).items()}
    return {"reasons": run["reasons"], "exact": run["exact"], "rows": rows, "params": params,
            "rewound": run["rewound"]}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["ddp", "fsdp2", "fsdp1"])
def test_ranks_widen_a_fused_gated_mlp_alike_and_rewind_it(tmp_path, kind):
    r0, r1 = run_in_folder(grow_fused, tmp_path, WORLD, kind, join_s=120)
    assert r0["reasons"][0].startswith("plateau: added neuron step 1 (")
    assert "1.gate_up_proj: +8 random" in r0["reasons"][0]  # half of 16 neurons: 16 rows
    assert r0["reasons"] == r1["reasons"]
    assert r0["exact"][:2] == r1["exact"][:2] == [True, True]  # then the rewind
    assert r0["rewound"] and r1["rewound"]  # to the best model's outputs, bit for bit
    assert r0["rows"] == [48, 64, 32]
    assert r0["params"] == r1["params"]
