"""DendriticLayer candidates: split and merge are exact for every bank kind, the state dict
always holds the merged form, and the candidate learns only through its tap."""

from __future__ import annotations

import pytest
import torch
from test_layers import CASES, make, n_params, randomize_mix

from perfora.rules.correlation import CorrelationTap


def grown(case: str, k: int):
    layer, x = make(case)
    gen = torch.Generator().manual_seed(11)
    for _ in range(k - 1):
        layer.grow(gen)
    randomize_mix(layer, gen)  # older dendrites live in the output
    layer.grow(gen)  # the newest has zero v and w rows
    return layer, x


def params(layer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in layer.named_parameters()}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_split_and_merge_are_exact(case, k):
    layer, x = grown(case, k)
    before, state = params(layer), {n: t.clone() for n, t in layer.state_dict().items()}
    count = n_params(layer)
    with torch.no_grad():
        out = layer(x)
    layer.split_candidate()
    assert layer.has_candidate and layer.banked == k - 1 and layer.num_dendrites == k
    assert n_params(layer) == count
    assert layer.structure()["num_dendrites"] == k
    with torch.no_grad():
        assert torch.equal(layer(x), out), "the candidate is not in the output"
    split_state = layer.state_dict()
    assert list(split_state) == list(state) or sorted(split_state) == sorted(state)
    for name, t in state.items():
        assert torch.equal(split_state[name], t), f"state_dict {name} is not the merged form"
    layer.merge_candidate()
    assert not layer.has_candidate
    after = params(layer)
    assert sorted(after) == sorted(before)
    for name, t in before.items():
        assert torch.equal(after[name], t), name
    with torch.no_grad():
        assert torch.equal(layer(x), out)


@pytest.mark.parametrize("case", ["linear_3d", "conv2d_groups2", "conv1d",
                                  "generic_features_last", "generic_channels_first"])
def test_candidate_learns_only_through_its_tap(case):
    layer, x = grown(case, 2)
    layer.split_candidate()
    layer.set_trainable(base=False, bank=False, cascade=False, out=False, candidate=True)
    x = x.clone().requires_grad_()
    layer(x).square().sum().backward()
    assert all(p.grad is None for p in layer.group_parameters("candidate")), \
        "without a tap the candidate is not in the graph"
    x_grad = x.grad.clone()
    x.grad = None
    layer.candidate_tap = CorrelationTap(layer.neuron_axis)
    layer(x).square().sum().backward()
    for p in layer.group_parameters("candidate"):
        assert p.grad is not None and p.grad.abs().sum() > 0
    for group in ("base", "bank", "cascade", "out"):
        for p in layer.group_parameters(group):
            assert p.grad is None, group
    assert torch.equal(x.grad, x_grad), "no error flows through the candidate"
    assert 0 <= layer.candidate_tap.take() <= 1


def test_load_state_dict_into_a_split_layer_and_grow_merges_first():
    layer, x = grown("linear_2d", 2)
    saved = {n: t.clone() for n, t in layer.state_dict().items()}
    layer.split_candidate()
    with torch.no_grad():
        for p in layer.group_parameters("candidate"):
            p.add_(1.0)
    layer.load_state_dict(saved)
    assert not layer.has_candidate
    for name, t in layer.state_dict().items():
        assert torch.equal(t, saved[name])
    layer.split_candidate()
    layer.grow(torch.Generator().manual_seed(3))
    assert not layer.has_candidate and layer.num_dendrites == 3
    layer.resize(1)
    assert not layer.has_candidate and layer.num_dendrites == 1


def test_trainable_flags_of_the_candidate_group_survive_split_and_merge():
    layer, _ = grown("conv2d", 2)
    layer.set_trainable(base=False, bank=False, cascade=False, out=False, candidate=True)
    layer.split_candidate()
    flags = {g: {p.requires_grad for p in layer.group_parameters(g)}
             for g in ("base", "bank", "cascade", "out", "candidate")}
    assert flags == {"base": {False}, "bank": {False}, "cascade": set(), "out": {False},
                     "candidate": {True}}
    layer.merge_candidate()
    assert {p.requires_grad for p in layer.parameters()} == {False}
