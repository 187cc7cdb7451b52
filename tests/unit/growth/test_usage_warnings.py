"""Warnings for loops that would train on without their dendrites."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import perfora


def _setup(register: bool = True):
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    ctl = perfora.GrowthController(model, seed=0, dendrite_init="default")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if register:
        ctl.set_optimizer(torch.optim.SGD, lr=0.1)
        optimizer, _ = ctl.build_optimizer()
    return model, ctl, optimizer


def _train(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    for _ in range(2):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def test_step_with_no_optimizer_registered_warns_once():
    model, ctl, optimizer = _setup(register=False)
    _train(model, optimizer)
    with pytest.warns(UserWarning, match="no optimizer registered"):
        ctl.step(1.0)


def test_training_on_with_the_stale_optimizer_after_growth_warns():
    model, ctl, optimizer = _setup()
    _train(model, optimizer)
    ctl.step(1.0)
    decision = ctl.add_dendrites()
    assert decision.optimizer is not optimizer
    _train(model, optimizer)  # the old optimizer: it does not hold the new dendrites
    with pytest.warns(UserWarning, match="did not change during the epoch since"):
        ctl.step(1.0)


def test_training_with_the_rebuilt_optimizer_gives_no_warning():
    model, ctl, optimizer = _setup()
    _train(model, optimizer)
    ctl.step(1.0)
    decision = ctl.add_dendrites()
    _train(model, decision.optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctl.step(1.0)


def test_no_warning_when_the_model_did_not_train_in_the_epoch():
    model, ctl, _ = _setup(register=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctl.step(1.0)  # scores reported without a training pass: nothing to judge
