"""Helpers for tests of what a widening passes through: one neuron step of the controller,
a widening undone by a rewind to a snapshot (the rewind to a narrower best model), a known
block's feed-forward pair as the plan finds it, and a fused gate-and-up MLP (Phi-3's layout)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

import perfora
from perfora.nn.perforation import layer_specs, rebuild_structure


def widened_and_rewound(model: nn.Module, x: torch.Tensor,
                        widen: Callable[[nn.Module], None]) -> tuple[torch.Tensor, torch.Tensor]:
    """``model``'s output on ``x`` before ``widen(model)``, and after it and a rewind to the
    snapshot taken before (structure rebuilt, weights loaded)."""
    specs, state = copy.deepcopy(layer_specs(model)), copy.deepcopy(model.state_dict())
    before = model(x)
    widen(model)
    rebuild_structure(model, specs)
    model.load_state_dict(state)
    return before, model(x)


def one_neuron_step(model: nn.Module, x: torch.Tensor, **settings
                    ) -> tuple[perfora.Decision, torch.Tensor]:
    """The decision of a controller's first neuron step on ``model`` (random rows unless
    ``settings`` say otherwise), and the model's output on ``x`` in eval mode before it."""
    ctl = perfora.GrowthController(model, **{
        "growth": "neurons", "switch_mode": "every_epoch", "max_neuron_steps": 1,
        "neuron_init": "random", "write_files": False, **settings})
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    ctl.build_optimizer()
    with torch.no_grad():
        before = model.eval()(x)
    return ctl.step(0.5), before


def known_pair(model: nn.Module, hidden: str) -> tuple[nn.Module, str]:
    """``model`` perforated in eval mode, and the reader the plan finds for its feed-forward
    layer ``hidden``: the layer gains neurons, the reader (it writes the residual stream)
    does not."""
    model = perfora.perforate(model.eval())
    plan = perfora.plan_widening(model)
    assert hidden in plan.widenable, plan.refused.get(hidden)
    reader = plan.layers[hidden].consumers[0][0]
    assert "residual" in plan.refused[reader]
    return model, reader


class FusedGatedMLP(nn.Module):
    """Phi-3's MLP with a residual add: one layer computes gate and up, cut in halves."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(width, 2 * hidden, bias=False)
        self.activation_fn = nn.SiLU()
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return x + self.down_proj(up * self.activation_fn(gate))
