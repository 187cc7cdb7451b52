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
from torch.nn.parallel import DistributedDataParallel as DDP

import perfora
from tests.support.ranks import run_in_folder
from tests.support.widening import FusedGatedMLP

WORLD = 2


def grow_fused(rank: int, tmp: Path, kind: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from perfora.parallel import shard_fsdp2, wrap_fsdp1

    torch.manual_seed(0)
    base = perfora.perforate(nn.Sequential(nn.Linear(4, 8), FusedGatedMLP(8, 16),
                                           nn.Linear(8, 3)))
    if kind == "ddp":
        model = DDP(base)
    elif kind == "fsdp1":
        model = wrap_fsdp1(base, device_id=torch.device("cpu"))
    else:
        model = shard_fsdp2(base, mesh=init_device_mesh("cpu", (WORLD,)))
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=2, neurons_per_step=0.5,
                                   write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(rank)  # each rank its own data
    x_fixed = torch.randn(4, 4, generator=torch.Generator().manual_seed(9))
    reasons, exact, rows = [], [], []
    for score in (0.5, 0.4, 0.3):  # the first model stays the best: the end rewinds to it
        model.train()
        for _ in range(3):
            x = torch.randn(16, 4, generator=gen)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, rank] > 0).long()).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            before = model(x_fixed)
        if not reasons:
            best = before  # the best model's outputs (every later score is lower)
        decision = ctl.step(score)
        model, opt = decision.model, decision.optimizer
        with torch.no_grad():
            exact.append(bool(torch.equal(model(x_fixed), before)))
        reasons.append(decision.reason)
        rows.append(ctl.backend.full_state(model)["1.gate_up_proj.base.weight"].shape[0])
    params = {k: v.tolist() for k, v in ctl.backend.full_state(model).items()}
    with torch.no_grad():
        rewound = bool(torch.equal(model(x_fixed), best))
    return {"reasons": reasons, "exact": exact, "rows": rows, "params": params,
            "rewound": rewound}


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
