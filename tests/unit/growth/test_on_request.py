"""Growth on request: ``add_dendrites()`` adds a dendrite set and ``add_neurons()`` a neuron
step whatever ``growth`` says, and both are in ``latest`` at once, so a run killed before its
next report resumes grown (``latest`` kept the model before the growth)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora

X = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))


def _build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 2))


@pytest.mark.parametrize("growth", ["neurons", "auto", "dendrites"])
@pytest.mark.parametrize("request_kind", ["add_dendrites", "add_neurons"])
def test_growth_on_request_is_of_its_kind_and_a_resume_from_latest_has_it(
        tmp_path, growth, request_kind):
    model = perfora.perforate(_build())
    ctl = perfora.GrowthController(model, growth=growth, run_dir=tmp_path)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    ctl.build_optimizer()
    before = model(X)
    ctl.step(0.5)
    decision = getattr(ctl, request_kind)()
    grown = decision.model
    assert torch.equal(grown(X), before)
    if request_kind == "add_dendrites":
        assert (grown[0].num_dendrites, grown[0].num_neurons) == (1, 12)
    else:
        assert (grown[0].num_dendrites, grown[0].num_neurons) == (0, 24)
    resumed = perfora.resume(_build(), tmp_path / "latest.safetensors",
                             optimizer=torch.optim.Adam, optimizer_args={"lr": 1e-3})
    assert resumed.epoch == 1
    assert (resumed.model[0].num_dendrites, resumed.model[0].num_neurons) == \
        (grown[0].num_dendrites, grown[0].num_neurons)
    live, back = grown.state_dict(), resumed.model.state_dict()
    assert live.keys() == back.keys() and all(torch.equal(live[k], back[k]) for k in live)
