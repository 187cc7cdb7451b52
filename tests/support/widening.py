"""Helpers for tests of what a widening passes through: one neuron step of the controller,
a widening undone by a rewind to a snapshot (the rewind to a narrower best model), a known
block's feed-forward pair as the plan finds it, a dendrite set trained one step (so that new
neurons join dendrites that act), a fused gate-and-up MLP (Phi-3's layout), and the epochs of a
rank that grows two neuron steps on its own data and rewinds to the first model."""

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


def grow_a_trained_dendrite_set(model: nn.Module, loss: Callable[[], torch.Tensor]) -> None:
    """One dendrite set on ``model``, trained one Adam step on ``loss()``: its output weights
    leave zero, so the set changes the output."""
    controller = perfora.GrowthController(model, seed=0, dendrite_init="default",
                                          write_files=False)
    controller.set_optimizer(torch.optim.Adam, lr=1e-2)
    controller.build_optimizer()
    controller.add_dendrites()
    controller.optimizer.zero_grad()
    loss().backward()
    controller.optimizer.step()


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


def grow_twice_and_rewind(model: nn.Module, ctl: perfora.GrowthController, rank: int,
                          x_fixed: torch.Tensor, label_axis: tuple[int, ...],
                          after_step: Callable[[nn.Module], None] = lambda m: None) -> dict:
    """Three epochs of 3 Adam steps on this rank's own data (inputs shaped like ``x_fixed``,
    the label: the sign of the input at index ``(rank, *label_axis)`` of each row), each
    followed by ``ctl.step`` with a falling score, so the controller (one neuron step per
    epoch, two at most) ends by rewinding to the first model. Returns the final model,
    each step's reason, whether each step kept ``x_fixed``'s output bit for bit, and whether
    the final output is the first model's; ``after_step(model)`` sees each step's model."""
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(rank)  # each rank its own data
    reasons, exact = [], []
    for score in (0.5, 0.4, 0.3):  # the first model stays the best: the end rewinds to it
        model.train()
        for _ in range(3):
            x = torch.randn(16, *x_fixed.shape[1:], generator=gen)
            opt.zero_grad()
            label = (x[(slice(None), rank, *label_axis)] > 0).long()
            nn.functional.cross_entropy(model(x), label).backward()
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
        after_step(model)
    with torch.no_grad():
        rewound = bool(torch.equal(model(x_fixed), best))
    return {"model": model, "reasons": reasons, "exact": exact, "rewound": rewound}
