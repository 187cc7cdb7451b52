"""A DDP loop whose wrapper the controller does not know: after a growth the user's old
wrapper syncs only the old parameters, the new ones train apart on each rank, and the run
used to finish with the ranks' weights different and no word. Now the first report after
that warns, on every rank; the documented loop (``step(score, model=ddp)``) stays silent.
2 real CPU ranks (gloo), each on its own data."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import perfora
from tests.support.ranks import run_in_folder


def train_with_own_wrapper(rank: int, tmp: Path, tell_controller: bool) -> dict:
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)))
    ctl = perfora.GrowthController(model, switch_mode="every_epoch", max_dendrites=2,
                                   write_files=False, dendrite_init="default")
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    opt, _ = ctl.build_optimizer()
    ddp = DDP(model, find_unused_parameters=True)
    gen = torch.Generator().manual_seed(rank)
    caught = []
    for score in (0.5, 0.6, 0.7):
        for _ in range(3):
            x = torch.randn(16, 6, generator=gen)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), (x[:, rank] > 0).long()).backward()
            opt.step()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            decision = ctl.step(score, model=ddp) if tell_controller else ctl.step(score)
        caught += [str(w.message) for w in seen]
        opt = decision.optimizer
        if tell_controller:
            ddp = decision.model
    return {"drift": [m for m in caught if "weights differ" in m]}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("tell_controller", [False, True])
def test_ranks_that_train_apart_are_warned_about(tmp_path, tell_controller):
    r0, r1 = run_in_folder(train_with_own_wrapper, tmp_path, 2, tell_controller, join_s=120)
    if tell_controller:
        assert r0["drift"] == r1["drift"] == []
    else:
        assert len(r0["drift"]) == len(r1["drift"]) == 1
        assert "step(score, model=ddp_model)" in r0["drift"][0]
        assert "train with decision.model after every decision.restructured" in r0["drift"][0]
