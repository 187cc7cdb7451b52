"""A per-batch scheduler the user steps goes on over the optimizer rebuilt at a restructure.

The reference is the same schedule stepped over an optimizer that never changes: after
``perfora.move_scheduler(scheduler, decision.optimizer)`` every later learning rate the
grown model's optimizer sees equals the reference's, and the optimizer actually steps with it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler

from perfora import ConfigError, GrowthController, move_scheduler, perforate


def build(name: str, optimizer: torch.optim.Optimizer):
    if name == "onecycle":
        return lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=40)
    if name == "lambda":
        return lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    warm = lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=5)
    cosine = lr_scheduler.CosineAnnealingLR(optimizer, T_max=20)
    return lr_scheduler.SequentialLR(optimizer, [warm, cosine], milestones=[5])


@pytest.mark.parametrize("name", ["onecycle", "lambda", "sequential"])
@pytest.mark.parametrize("growth", ["dendrites", "neurons"])
def test_moved_scheduler_continues_the_schedule(name, growth):
    torch.manual_seed(0)
    model = perforate(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    ctl = GrowthController(model, growth=growth, write_files=False)
    ctl.set_optimizer(torch.optim.SGD, lr=0.01, momentum=0.9)
    optimizer = ctl.build_optimizer()[0]
    scheduler = build(name, optimizer)
    reference_opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.01, momentum=0.9)
    reference = build(name, reference_opt)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    seen, expected = [], []
    for batch in range(30):
        if batch == 12:
            decision = ctl.add_dendrites() if growth == "dendrites" else ctl.add_neurons()
            optimizer = decision.optimizer
            assert move_scheduler(scheduler, optimizer) is scheduler
        seen.append(optimizer.param_groups[0]["lr"])
        expected.append(reference_opt.param_groups[0]["lr"])
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        reference_opt.step()
        scheduler.step()
        reference.step()
    assert seen == expected
    assert scheduler.optimizer is optimizer
    assert len(set(seen[12:])) > 1  # the rates kept moving after the restructure


def test_move_scheduler_refuses_what_it_cannot_move():
    model = nn.Linear(2, 2)
    old = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = lr_scheduler.StepLR(old, step_size=2)
    two_groups = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=0.1)
    with pytest.raises(ConfigError, match="1 param groups and the new one 2"):
        move_scheduler(scheduler, two_groups)
    assert scheduler.optimizer is old  # nothing moved
    with pytest.raises(ConfigError, match="needs the new torch optimizer"):
        move_scheduler(scheduler, "adam")
    with pytest.raises(ConfigError, match="needs a torch LR scheduler"):
        move_scheduler(object(), old)
