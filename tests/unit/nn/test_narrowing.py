"""Neuron growth undone: a model widened after a snapshot takes the snapshot's structure and
weights back (the rewind to a narrower best model) and then computes the snapshot's bits."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import perfora
from perfora.errors import PerforationError
from perfora.nn.narrowing import narrow_widenings
from perfora.nn.perforation import layer_specs, rebuild_structure


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 6),
                                           nn.SiLU(), nn.Linear(6, 3)))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                                           nn.Flatten(), nn.Linear(4 * 4 * 4, 5), nn.GELU(),
                                           nn.Linear(5, 2)))


def _snapshot(model: nn.Module) -> tuple[dict, dict]:
    return copy.deepcopy(layer_specs(model)), copy.deepcopy(model.state_dict())


def _rewind(model: nn.Module, snap: tuple[dict, dict]) -> None:
    specs, state = snap
    rebuild_structure(model, specs)
    model.load_state_dict(state)


def _train_a_step(model: nn.Module, x: torch.Tensor) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    model(x).square().mean().backward()
    opt.step()
    model.eval()


@pytest.mark.parametrize("build, x", [(_mlp, torch.randn(7, 5)),
                                      (_cnn, torch.randn(2, 3, 6, 6))])
def test_a_rewind_past_widenings_and_dendrites_gives_the_snapshot_back(build, x):
    model = build().eval()
    g = torch.Generator().manual_seed(1)
    first = perfora.dendritic_layers(model)
    start, start_out = _snapshot(model), model(x)
    for layer in first.values():
        layer.grow(g)
    _train_a_step(model, x)
    grown, grown_out = _snapshot(model), model(x)
    paths = [p for p in perfora.plan_widening(model).widenable]
    for path in paths:
        perfora.widen(model, path, 2, generator=g)
    _train_a_step(model, x)
    for layer in perfora.dendritic_layers(model).values():
        layer.grow(g)
    perfora.widen(model, paths[0], 3, generator=g)
    _train_a_step(model, x)

    _rewind(model, grown)
    assert torch.equal(model(x), grown_out)
    assert layer_specs(model) == grown[0]
    assert {k: v.shape for k, v in model.state_dict().items()} == \
        {k: v.shape for k, v in grown[1].items()}
    _rewind(model, start)
    assert torch.equal(model(x), start_out)
    assert layer_specs(model) == start[0]


def test_a_narrowed_model_widens_again_exactly():
    model, x = _mlp().eval(), torch.randn(4, 5)
    perfora.widen(model, "0", 3)
    narrow_widenings(model, "0", 0)
    assert model[0].num_neurons == 8 and model[2].base.in_features == 8
    assert isinstance(model[1], nn.Tanh)  # the block-wise wrapper gave its place back
    before = model(x)
    perfora.widen(model, "0", 2)
    assert torch.equal(model(x), before)
    assert model[0].widenings == [{"k": 2, "consumers": [["2", 1]], "through": [["1", -1]],
                                   "partners": []}]


def test_narrowing_refuses_a_layer_changed_after_its_widening():
    model = _mlp()
    perfora.widen(model, "0", 3)
    model[0].widenings = [{**model[0].widenings[0], "k": 2}]  # a record that does not fit
    with pytest.raises(PerforationError, match="newest block"):
        narrow_widenings(model, "0", 0)
