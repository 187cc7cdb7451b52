"""Neuron growth through a depthwise conv under DDP, FSDP2 and FSDP1: 2 real CPU ranks (gloo),
each on its own data. Each step widens the expanding conv, the depthwise conv and the BatchNorms
between (under FSDP2 one layer pair at a time), keeps the output bit for bit, leaves the ranks'
parameters identical, and the rewind to the narrow best model shrinks them back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import perfora
from tests.support.ranks import run_in_folder, wrapped_for
from tests.support.widening import grow_twice_and_rewind

WORLD = 2


def grow_through_depthwise(rank: int, tmp: Path, kind: str) -> dict:
    torch.manual_seed(0)
    base = perfora.perforate(nn.Sequential(
        nn.Conv2d(2, 8, 1), nn.BatchNorm2d(8), nn.ReLU6(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU6(),
        nn.Conv2d(8, 3, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten()))
    model = wrapped_for(kind, base, WORLD)
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=2, write_files=False)
    x_fixed = torch.randn(4, 2, 6, 6, generator=torch.Generator().manual_seed(9))
    groups, training = [], []

    def record(model: nn.Module) -> None:
        training.append(any(m.training for m in model.modules()))
        groups.append(list(ctl.backend.full_state(model)["3.base.weight"].shape))

    run = grow_twice_and_rewind(model, ctl, rank, x_fixed, (0, 0), record)
    params = {k: v.tolist() for k, v in ctl.backend.full_state(run["model"]).items()
              if "running" not in k and "num_batches" not in k}
    return {"reasons": run["reasons"], "exact": run["exact"], "groups": groups,
            "params": params, "rewound": run["rewound"], "training": training}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["ddp", "fsdp2", "fsdp1"])
def test_ranks_widen_a_depthwise_block_alike_and_rewind_it(tmp_path, kind):
    r0, r1 = run_in_folder(grow_through_depthwise, tmp_path, WORLD, kind, join_s=120)
    assert r0["reasons"][:2] == ["plateau: added neuron step 1 (0: +8 random)",
                                 "plateau: added neuron step 2 (0: +8 random)"]
    assert r0["reasons"] == r1["reasons"]
    assert r0["exact"][:2] == r1["exact"][:2] == [True, True]  # then the rewind
    assert r0["rewound"] and r1["rewound"]  # to the best model's outputs, bit for bit
    assert r0["training"] == r1["training"] == [False] * 3  # still in eval mode, wrapper too
    assert r0["groups"] == [[16, 1, 3, 3], [24, 1, 3, 3], [8, 1, 3, 3]]
    assert r0["params"] == r1["params"]
