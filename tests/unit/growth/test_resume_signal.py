"""The error signal a growth step reads (GradMax's for neurons, the probe's for error-initialised
dendrites) covers the epoch before the step only. With ``n_epochs_to_switch=1`` every epoch may
be followed by a step, and the signal used to pile up over all of them; a resumed run, which
starts from the checkpoint without it, then grew other weights than the uninterrupted run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora

X = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
Y = torch.arange(64) % 2
SCORES = [0.5, 0.6, 0.7, 0.7]  # improving (each epoch may grow), then a plateau: a step


def _build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 2))


def _run(ctl: perfora.GrowthController, until: int) -> perfora.GrowthController:
    model, opt = ctl.model, ctl.optimizer
    while ctl.epoch < until:
        model.train()
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), Y).backward()
        opt.step()
        decision = ctl.step(SCORES[ctl.epoch])
        model, opt = decision.model, decision.optimizer
    return ctl


@pytest.mark.parametrize("settings", [
    {"growth": "neurons", "neuron_init": "gradmax"},
    {"growth": "dendrites", "dendrite_init": "error"},
], ids=["gradmax-neurons", "error-dendrites"])
def test_a_run_resumed_just_before_a_step_grows_the_same_weights(tmp_path, settings):
    def start(run_dir):
        ctl = perfora.GrowthController(perfora.perforate(_build()), run_dir=run_dir,
                                       maximize=True, n_epochs_to_switch=1,
                                       checkpoint_time_budget=None, **settings)
        ctl.set_optimizer(torch.optim.SGD, lr=0.1)
        ctl.build_optimizer()
        return ctl

    whole = _run(start(tmp_path / "whole"), len(SCORES))
    assert whole.state.num_steps == 1  # the last epoch grew
    _run(start(tmp_path / "cut"), len(SCORES) - 1)
    resumed = perfora.resume(_build(), tmp_path / "cut" / "latest.safetensors",
                             optimizer=torch.optim.SGD, optimizer_args={"lr": 0.1})
    _run(resumed, len(SCORES))
    live, back = whole.model.state_dict(), resumed.model.state_dict()
    assert live.keys() == back.keys()
    assert [k for k in live if not torch.equal(live[k], back[k])] == []
