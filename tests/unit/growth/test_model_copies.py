"""A model being grown can be copied and pickled in every epoch, including the one before a
growth step, when perfora's recorders hook its layers; and a copy never feeds the recorders
of the model it was copied from."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import perfora


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


def _train(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    torch.manual_seed(1)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    model.train()
    if optimizer is not None:
        optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    if optimizer is not None:
        optimizer.step()


@pytest.mark.parametrize("growth", ["dendrites", "neurons"])
def test_copies_and_pickles_work_in_the_epoch_before_growth(growth):
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)))
    ctl = perfora.GrowthController(model, write_files=False, growth=growth,
                                   n_epochs_to_switch=2, max_dendrites=1, max_neuron_steps=1)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-2)
    optimizer, _ = ctl.build_optimizer()
    armed = False
    for _ in range(3):
        _train(ctl.model, optimizer)
        if _hooks(ctl.model):  # the recorders are on: a growth step may follow this epoch
            armed = True
            rows = copy.deepcopy(_recorded(ctl))
            buffer = io.BytesIO()
            torch.save(ctl.model, buffer)  # used to fail: a closure cannot be pickled
            twin = pickle.loads(pickle.dumps(ctl.model))
            clone = copy.deepcopy(ctl.model)
            for other in (twin, clone):
                _train(other)
                assert _hooks(other) == 0  # their copies of the hooks removed themselves
            assert _same(_recorded(ctl), rows)  # and fed nothing into the original's
            buffer.seek(0)
            loaded = torch.load(buffer, weights_only=False)
            assert torch.equal(loaded(torch.ones(2, 6)), ctl.model(torch.ones(2, 6)))
        decision = ctl.step(1.0)
        optimizer = decision.optimizer
    assert armed and ctl.state.additions == 1


def _recorded(ctl: perfora.GrowthController) -> dict:
    recorder = ctl._probe if ctl.config.growth == "dendrites" else ctl._signal
    return {k: v for k, v in vars(recorder).items() if k in ("_rows", "_sums", "_inputs")}


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k])
                                                                     for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b
