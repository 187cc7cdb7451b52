"""DendriticLayer: exact growth, the dendrite formula, parameter accounting, gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perfora import ConversionError, DendriticLayer

ACTIVATIONS = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": F.relu}


class FeatureBlock(nn.Module):
    """A module perfora does not know: a Linear plus a nonlinearity, features last."""

    def __init__(self, d_in: int = 7, d_out: int = 6) -> None:
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) * 2.0


class ChannelMix(nn.Module):
    """A module whose neurons are on axis 1 of a [B, C, L] output (a Linear over channels)."""

    def __init__(self, c_in: int = 3, c_out: int = 5) -> None:
        super().__init__()
        self.mix = nn.Linear(c_in, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(x.transpose(1, 2)).transpose(1, 2)


# id -> (base factory, input shape (or a factory of the input), neuron axis, number of neurons)
CASES = {
    "linear_2d": (lambda: nn.Linear(7, 5), (4, 7), -1, 5),
    "linear_3d": (lambda: nn.Linear(7, 5), (3, 4, 7), -1, 5),
    "linear_wide": (lambda: nn.Linear(32, 8), (6, 32), -1, 8),
    "linear_no_bias": (lambda: nn.Linear(7, 5, bias=False), (4, 7), -1, 5),
    "conv1d": (lambda: nn.Conv1d(3, 6, 3, padding=1), (2, 3, 10), 1, 6),
    "conv2d": (lambda: nn.Conv2d(3, 4, 3), (2, 3, 8, 8), 1, 4),
    "conv2d_no_bias": (lambda: nn.Conv2d(3, 4, 3, bias=False), (2, 3, 8, 8), 1, 4),
    "conv3d": (lambda: nn.Conv3d(2, 4, 3), (2, 2, 5, 5, 5), 1, 4),
    "conv2d_groups2": (lambda: nn.Conv2d(4, 6, 3, padding=1, groups=2), (2, 4, 6, 6), 1, 6),
    "conv2d_reflect": (
        lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), (2, 3, 6, 6), 1, 4),
    "generic_features_last": (lambda: FeatureBlock(7, 6), (4, 7), -1, 6),
    "generic_channels_first": (lambda: ChannelMix(3, 5), (2, 3, 9), 1, 5),
    "generic_layernorm": (lambda: nn.LayerNorm(6), (4, 6), -1, 6),
    "generic_embedding": (lambda: nn.Embedding(10, 6), lambda: torch.randint(0, 10, (3, 5)),
                          -1, 6),
    "generic_conv_transpose": (lambda: nn.ConvTranspose1d(3, 4, 3), (2, 3, 7), 1, 4),
}


def make(case: str, activation: str = "sigmoid", seed: int = 0):
    factory, shape, axis, n = CASES[case]
    torch.manual_seed(seed)
    base = factory()
    layer = DendriticLayer(base, num_neurons=n, neuron_axis=axis, activation=activation)
    x = shape() if callable(shape) else torch.randn(shape)
    return layer, x


def randomize_mix(layer: DendriticLayer, gen: torch.Generator) -> None:
    """Give every existing dendrite a nonzero v row and cascade weights."""
    with torch.no_grad():
        if layer.out_weight is not None:
            layer.out_weight.copy_(torch.randn(layer.out_weight.shape, generator=gen))
        if layer.cascade is not None:
            layer.cascade.copy_(torch.randn(layer.cascade.shape, generator=gen))


def per_neuron(vec: torch.Tensor, ndim: int, axis: int) -> torch.Tensor:
    shape = [1] * ndim
    shape[axis % ndim] = vec.numel()
    return vec.reshape(shape)


def dendrite_module(layer: DendriticLayer, k: int) -> nn.Module:
    """Dendrite k as a standalone copy of the source layer (bank layout: see row_bank.py).

    Linear/Conv banks hold, per conv group, the K dendrites' rows one after another
    (``[groups, K, rows_per_group, ...]``); generic banks stack each parameter on dim 0.
    """
    src = layer.source
    dendrite = copy.deepcopy(src)
    K = layer.num_dendrites
    with torch.no_grad():
        if layer.kind == "generic":
            for name, p in dendrite.named_parameters():
                p.copy_(layer.bank_params[name.replace(".", "__")][k])
            return dendrite
        groups = getattr(src, "groups", 1)
        w = layer.bank_weight.reshape(groups, K, -1, *src.weight.shape[1:])[:, k]
        dendrite.weight.copy_(w.reshape(src.weight.shape))
        if src.bias is not None:
            dendrite.bias.copy_(layer.bank_bias.reshape(groups, K, -1)[:, k].reshape(-1))
    return dendrite


def reference_forward(layer: DendriticLayer, x: torch.Tensor) -> torch.Tensor:
    """The dendrite formula (perfora.nn.layers), one dendrite at a time, in plain Python."""
    act = ACTIVATIONS[layer.activation]
    y = layer.base(x)
    axis = layer.neuron_axis
    ds: list[torch.Tensor] = []
    for k in range(layer.num_dendrites):
        a = dendrite_module(layer, k)(x)
        for j in range(k):
            w_kj = layer.cascade[k * (k - 1) // 2 + j]  # packed lower triangle, row by row
            a = a + per_neuron(w_kj, a.ndim, axis) * ds[j]
        ds.append(act(a))
    for k, d in enumerate(ds):
        y = y + per_neuron(layer.out_weight[k], d.ndim, axis) * d
    return y


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --------------------------------------------------------------------------- exact growth
@pytest.mark.parametrize("case", list(CASES))
def test_growth_with_fresh_dendrites_keeps_output_bitwise(case):
    layer, x = make(case)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        plain = layer(x)
        for k in range(1, 4):
            layer.grow(gen)
            assert layer.num_dendrites == k
            after = layer(x)
            assert torch.equal(after, plain), f"growth {k} changed the output"


# vmap evaluates a generic bank's K transposed convs as one grouped convolution, whose
# rounding depends on K: an older dendrite's output moves in the last bit when one is added
INEXACT_GROWTH = {"generic_conv_transpose"}


@pytest.mark.parametrize("case", [
    pytest.param(case, marks=pytest.mark.xfail(reason="vmap's grouped convolution rounds by K"))
    if case in INEXACT_GROWTH else case for case in CASES])
def test_growth_after_trained_dendrites_keeps_output_bitwise(case):
    """Earlier dendrites with nonzero v and cascade: adding one more changes nothing."""
    layer, x = make(case)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        layer.grow(gen)
        for k in range(2, 5):
            randomize_mix(layer, gen)
            before = layer(x)
            layer.grow(gen)
            after = layer(x)
            diff = (after - before).abs().max().item()
            assert torch.equal(after, before), (
                f"growth to K={k} changed the output by up to {diff:.3g}")


@pytest.mark.parametrize("case", ["linear_2d", "conv2d_groups2", "generic_features_last"])
def test_new_dendrite_is_live_once_its_v_is_nonzero(case):
    """Growth is exact because v starts at zero, not because the dendrite is dead."""
    layer, x = make(case)
    with torch.no_grad():
        before = layer(x)
        layer.grow(torch.Generator().manual_seed(3))
        assert all(p.abs().sum() > 0 for p in layer.group_parameters("bank"))
        assert torch.count_nonzero(layer.out_weight) == 0
        layer.out_weight.fill_(0.5)
        assert not torch.allclose(layer(x), before)


def test_grow_is_reproducible_from_a_seeded_generator():
    a, x = make("conv2d_groups2")
    b, _ = make("conv2d_groups2")
    for _ in range(3):
        a.grow(torch.Generator().manual_seed(7))
        b.grow(torch.Generator().manual_seed(7))
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name
    c, _ = make("conv2d_groups2")
    c.grow(torch.Generator().manual_seed(8))
    assert not torch.equal(c.bank_weight, a.bank_weight[: c.bank_weight.shape[0]])


# --------------------------------------------------------------------------- the formula
REFERENCE_CASES = ["linear_2d", "linear_3d", "conv1d", "conv2d", "conv3d", "conv2d_groups2",
                   "generic_features_last", "generic_channels_first", "generic_layernorm",
                   "generic_embedding", "generic_conv_transpose"]


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("case", REFERENCE_CASES)
def test_forward_matches_per_dendrite_reference(case, activation):
    layer, x = make(case, activation=activation)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for _ in range(3):
            layer.grow(gen)
        randomize_mix(layer, gen)
        assert torch.count_nonzero(layer.cascade) == layer.cascade.numel()
        got = layer(x)
        want = reference_forward(layer, x)
    assert got.shape == layer.base(x).shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # and the dendrites really contribute
    assert not torch.allclose(got, layer.base(x), atol=1e-3)


# --------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("case", ["linear_2d", "linear_no_bias", "conv2d", "conv2d_no_bias",
                                  "conv3d", "conv2d_groups2", "generic_features_last"])
def test_parameter_count_is_exact(case):
    factory, _, _, n = CASES[case]
    torch.manual_seed(0)
    plain = factory()
    base_params = n_params(plain)
    layer, _ = make(case)
    assert n_params(layer) == base_params  # K = 0: nothing extra, no template copy
    gen = torch.Generator().manual_seed(5)
    for K in range(1, 5):
        layer.grow(gen)
        expected = base_params + K * base_params + K * n + K * (K - 1) // 2 * n
        assert n_params(layer) == expected, f"K={K}"
    assert tuple(layer.out_weight.shape) == (4, n)
    assert tuple(layer.cascade.shape) == (6, n)


@pytest.mark.parametrize("case", ["linear_2d", "conv2d_groups2", "generic_features_last"])
def test_resize_gives_the_same_shapes_as_growing(case):
    grown, x = make(case)
    sized, _ = make(case)
    for _ in range(3):
        grown.grow()
    sized.resize(3)
    assert sized.num_dendrites == 3
    shapes = {n: p.shape for n, p in grown.named_parameters()}
    assert {n: p.shape for n, p in sized.named_parameters()} == shapes
    with torch.no_grad():  # zero v: a resized layer computes the base layer
        assert torch.equal(sized(x), sized.base(x))
    sized.resize(0)
    assert n_params(sized) == n_params(sized.base)


@pytest.mark.parametrize("case", list(CASES))
def test_load_state_dict_takes_the_saved_dendrite_count(case):
    """A grown state loads into a layer that has not grown (Lightning's weight restore and
    ddp_spawn's copy-back rely on it): same dendrite count, same outputs."""
    grown, x = make(case)
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        grown.grow(gen)
    with torch.no_grad():
        grown.out_weight.normal_()
    fresh = copy.deepcopy(grown)
    fresh.resize(0)
    fresh.load_state_dict(grown.state_dict())
    assert fresh.num_dendrites == 2
    with torch.no_grad():
        assert torch.equal(fresh(x), grown(x))
    partial = {k: v for k, v in grown.state_dict().items() if k != "out_weight"}
    with pytest.raises(RuntimeError, match="out_weight"):  # an incomplete state still fails
        fresh.load_state_dict(partial)


@pytest.mark.parametrize("case", ["linear_2d", "linear_3d", "conv2d", "conv2d_groups2",
                                  "conv3d", "generic_features_last", "generic_channels_first",
                                  "generic_layernorm", "generic_embedding"])
def test_no_dead_parameters(case):
    for K in range(4):
        layer, x = make(case)
        gen = torch.Generator().manual_seed(6)
        for _ in range(K):
            layer.grow(gen)
        layer(x).square().sum().backward()
        params = dict(layer.named_parameters())
        assert len(params) == len(list(layer.base.parameters())) + (0 if K == 0 else (
            len(layer.group_parameters("bank")) + 1 + (1 if K > 1 else 0)))
        for name, p in params.items():
            assert p.requires_grad, name
            assert p.grad is not None, f"K={K}: {name} got no gradient"


# --------------------------------------------------------------------------- trainability
def flags(layer: DendriticLayer) -> dict[str, set[bool]]:
    return {g: {p.requires_grad for p in layer.group_parameters(g)}
            for g in ("base", "bank", "cascade", "out")}


@pytest.mark.parametrize("case", ["linear_2d", "conv2d_groups2", "generic_features_last"])
def test_set_trainable_per_group_survives_growth(case):
    layer, x = make(case)
    gen = torch.Generator().manual_seed(9)
    layer.grow(gen)
    layer.grow(gen)
    layer.set_trainable(base=False, bank=True, cascade=False, out=True)
    want = {"base": {False}, "bank": {True}, "cascade": {False}, "out": {True}}
    assert flags(layer) == want
    layer.grow(gen)
    assert flags(layer) == want, "grow() lost the trainable flags"
    layer(x).sum().backward()
    for group, (flag,) in want.items():
        for p in layer.group_parameters(group):
            assert (p.grad is not None) == flag, group

    layer.set_trainable(base=True, bank=False, cascade=True, out=False)
    want = {"base": {True}, "bank": {False}, "cascade": {True}, "out": {False}}
    assert flags(layer) == want
    layer.grow(gen)
    assert flags(layer) == want


def test_set_trainable_before_any_dendrite_applies_to_later_ones():
    layer, _ = make("conv2d")
    layer.set_trainable(bank=False, out=False)
    layer.grow()
    layer.grow()
    assert flags(layer) == {"base": {True}, "bank": {False}, "cascade": {True}, "out": {False}}


def test_set_trainable_rejects_unknown_group():
    layer, _ = make("linear_2d")
    with pytest.raises(ValueError, match="dendrites"):
        layer.set_trainable(dendrites=False)


# --------------------------------------------------------------------------- construction
def test_bad_activation_and_neuron_count_raise():
    with pytest.raises(ConversionError, match="softplus"):
        DendriticLayer(nn.Linear(3, 2), num_neurons=2, neuron_axis=-1, activation="softplus")
    with pytest.raises(ConversionError, match="neuron"):
        DendriticLayer(nn.Linear(3, 2), num_neurons=0, neuron_axis=-1)
