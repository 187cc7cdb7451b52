"""The fused dendrite mix (perfora/kernels.py) against a reference of the formula.

The reference is written from the formula in ``perfora.nn.layers``, one dendrite at a time, each
as a standalone copy of the wrapped layer, with selective-growth sets computed in the full
neuron space. Outputs and the gradients of every parameter and of the input must agree, for
Linear and Conv1d/2d/3d, K = 0..3, every activation, partial sets, a frozen base and frozen
parameter groups, and (drawn by hypothesis) odd shapes, empty batches and non-contiguous inputs
against the autograd code. The hand-written backward is also checked by
``torch.autograd.gradcheck`` in float64.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from perfora import DendriticLayer
from perfora.nn.kernels import FusedMix, MixSpec

ACTS = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": F.relu}

# id -> (base factory, input shape, neuron axis, neurons)
CASES = {
    "linear": (lambda: nn.Linear(7, 5), (6, 7), -1, 5),
    "linear_3d": (lambda: nn.Linear(7, 5), (3, 4, 7), -1, 5),
    "linear_no_bias": (lambda: nn.Linear(7, 5, bias=False), (6, 7), -1, 5),
    "conv1d": (lambda: nn.Conv1d(3, 4, 3, padding=1), (2, 3, 9), 1, 4),
    "conv2d": (lambda: nn.Conv2d(3, 4, 3, padding=1), (2, 3, 6, 6), 1, 4),
    "conv2d_strided": (lambda: nn.Conv2d(3, 4, 3, stride=2, dilation=2, bias=False),
                       (2, 3, 7, 7), 1, 4),
    "conv3d": (lambda: nn.Conv3d(2, 3, 3, padding=1), (2, 2, 4, 4, 4), 1, 3),
}
FUSABLE = list(CASES)


def build(case: str, k: int, activation: str = "sigmoid", dtype=torch.float64,
          neurons: list[list[int] | None] | None = None, seed: int = 0) -> tuple:
    factory, shape, axis, n = CASES[case]
    torch.manual_seed(seed)
    layer = DendriticLayer(factory(), num_neurons=n, neuron_axis=axis, activation=activation)
    layer.to(dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    for i in range(k):
        layer.grow(gen, neurons=None if neurons is None else neurons[i])
    with torch.no_grad():  # every term live: nonzero v and cascade
        for p in (layer.out_weight, layer.cascade):
            if p is not None:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype))
    x = torch.randn(shape, generator=gen, dtype=dtype)
    return layer, x


def reference(layer: DendriticLayer, x: torch.Tensor) -> torch.Tensor:
    """y + sum_k v[k] * act(D_k(x) + sum_{j<k} w[k, j] * d_j), each set on its own neurons."""
    act = ACTS[layer.activation]
    src = layer.source
    y = layer.base(x)
    axis = layer.neuron_axis % y.dim()
    n = layer.num_neurons
    sets = layer.set_neurons() or [list(range(n))] * layer.num_dendrites

    def per_neuron(vec: torch.Tensor) -> torch.Tensor:
        shape = [1] * y.dim()
        shape[axis] = n
        return vec.reshape(shape)

    full: list[torch.Tensor] = []  # each d_k in the full neuron space (zero where not fed)
    start, row = 0, 0
    for k, fed in enumerate(sets):
        rows = slice(start, start + len(fed))
        start += len(fed)
        w = layer.bank_weight[rows]
        b = None if layer.bank_bias is None else layer.bank_bias[rows]
        if isinstance(src, nn.Linear):
            pre = F.linear(x, w, b)
        else:
            pre = src._conv_forward(x, w, b)
        index = torch.tensor(fed)
        a = torch.zeros_like(y).index_copy(axis, index, pre)
        for j in range(k):
            a = a + per_neuron(layer.cascade[row]) * full[j]
            row += 1
        mask = torch.zeros(n, dtype=y.dtype)
        mask[index] = 1
        full.append(act(a) * per_neuron(mask))
    for k, d in enumerate(full):
        y = y + per_neuron(layer.out_weight[k]) * d
    return y


def grads(layer: DendriticLayer, x: torch.Tensor, fn) -> tuple[torch.Tensor, dict]:
    """Output of fn(layer, x), and d(sum(out * r))/d(every tensor that needs a gradient)."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    out = fn(layer, x)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(9),
                          dtype=out.dtype)
    (out * weights).sum().backward()
    got = {name: p.grad for name, p in layer.named_parameters() if p.requires_grad}
    got["input"] = x.grad
    return out.detach(), got


def assert_matches(layer: DendriticLayer, x: torch.Tensor, tol: float = 1e-10) -> None:
    out, got = grads(layer, x, lambda m, inp: m(inp))
    ref, want = grads(layer, x, reference)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    assert got.keys() == want.keys()
    for name in want:
        assert (got[name] is None) == (want[name] is None), name
        if want[name] is not None:
            torch.testing.assert_close(got[name], want[name], rtol=tol, atol=tol,
                                       msg=lambda m, name=name: f"{name}: {m}")


def uses_fused(layer: DendriticLayer, x: torch.Tensor) -> bool:
    out = layer(x.detach().requires_grad_())
    return type(out.grad_fn).__name__ == "FusedMixBackward"


# ------------------------------------------------------------------------ forward, backward
@pytest.mark.parametrize("activation", list(ACTS))
@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("case", FUSABLE)
def test_outputs_and_gradients_match_the_reference(case, k, activation):
    layer, x = build(case, k, activation)
    assert uses_fused(layer, x) == (k >= 2)  # K = 1 stays on three autograd nodes
    assert_matches(layer, x)


@pytest.mark.parametrize("case", ["linear", "conv2d"])
def test_float32_matches_the_reference(case):
    layer, x = build(case, 3, dtype=torch.float32)
    assert uses_fused(layer, x)
    assert_matches(layer, x, tol=1e-5)


@pytest.mark.parametrize("case", FUSABLE)
def test_fused_and_autograd_paths_agree(case):
    """The fused node and the plain autograd code (used when tracing) give the same numbers."""
    fused, x = build(case, 3, dtype=torch.float32)
    plain = copy.deepcopy(fused)
    plain._fused_spec = lambda *args: None
    out_f, got_f = grads(fused, x, lambda m, inp: m(inp))
    out_p, got_p = grads(plain, x, lambda m, inp: m(inp))
    assert torch.equal(out_f, out_p)  # same kernels in the same order: the same bits
    for name in got_p:
        torch.testing.assert_close(got_f[name], got_p[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["linear", "conv1d", "conv2d", "conv3d"])
def test_selective_growth_matches_the_reference(case):
    n = CASES[case][3]
    layer, x = build(case, 3, neurons=[None, [0, 2], [1, 2, n - 1]])
    assert layer.dendrite_mask is not None
    assert_matches(layer, x)


@pytest.mark.parametrize(("case", "k"), [("linear", 3), ("conv2d", 3), ("conv2d", 5)])
def test_frozen_base_and_groups(case, k):
    layer, x = build(case, k)
    for p in layer.base.parameters():
        p.requires_grad_(False)
    layer.remember_frozen_base()
    assert uses_fused(layer, x)
    assert_matches(layer, x)
    _, got = grads(layer, x, lambda m, inp: m(inp))
    assert not any(name.startswith("base.") for name in got)
    for frozen in ("bank", "cascade", "out"):
        layer.set_trainable(**{frozen: False})
        _, got = grads(layer, x, lambda m, inp: m(inp))
        assert all(not name.startswith(frozen) for name in got), frozen
        assert_matches(layer, x)
        layer.set_trainable(**{frozen: True})


def test_growth_under_the_fused_path_is_exact_and_keys_are_unchanged():
    layer, x = build("conv2d", 2, dtype=torch.float32)
    keys = {name: tuple(t.shape) for name, t in layer.state_dict().items()}
    assert set(keys) == {"base.weight", "base.bias", "bank_weight", "bank_bias", "cascade",
                         "out_weight"}
    assert keys["bank_weight"] == (8, 3, 3, 3) and keys["cascade"] == (1, 4)
    with torch.no_grad():
        before = layer(x)
        layer.grow(torch.Generator().manual_seed(5))
        assert torch.equal(layer(x), before)


@pytest.mark.parametrize("k", [4, 5])
@pytest.mark.parametrize("case", ["conv1d", "conv2d", "conv2d_strided"])
def test_conv_backward_with_many_dendrites_matches_the_reference(case, k):
    """From K = 4 the conv backward folds held gradient maps into accumulators part-way:
    the gradients must not depend on when it does."""
    layer, x = build(case, k)
    assert uses_fused(layer, x)
    assert_matches(layer, x)


class _MapsAtConvBackward(TorchDispatchMode):
    """At every ``convolution_backward``, how many distinct live tensors have ``numel``
    elements (the garbage collector's view: the backward's locals and saved tensors)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel = numel
        self.counts: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution_backward.default:
            gc.collect()
            storages = {obj.untyped_storage().data_ptr() for obj in gc.get_objects()
                        if type(obj) in (torch.Tensor, nn.Parameter)
                        and obj.numel() == self.numel}
            self.counts.append(len(storages))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("k", "gradient_maps"), [(2, 1), (3, 2), (5, 3)])
def test_conv_backward_keeps_few_gradient_maps_alive(k, gradient_maps):
    """Memory: while a dendrite's convolution backward runs, the K saved ``d_k`` and the
    incoming gradient are alive, plus at most 1 / 2 / 3 gradient maps of the dendrites for
    K = 2 / 3 / 5 (all K of them before the conv backward was streamed)."""
    torch.manual_seed(0)
    layer = DendriticLayer(nn.Conv2d(4, 6, 3, padding=1), num_neurons=6, neuron_axis=1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(k):
        layer.grow(gen)
    with torch.no_grad():
        layer.cascade.normal_(0, 0.5, generator=gen)
        layer.out_weight.normal_(0, 0.5, generator=gen)
    x = torch.randn(8, 4, 10, 10, generator=gen, requires_grad=True)
    out = layer(x)
    assert type(out.grad_fn).__name__ == "FusedMixBackward"
    loss = (out * out).sum()
    del out
    probe = _MapsAtConvBackward(numel=8 * 6 * 10 * 10)  # one output map; x is 8 * 4 * 10 * 10
    with probe:
        loss.backward()
    # one convolution backward per dendrite, then the base conv's own (by then all is freed)
    assert len(probe.counts) == k + 1
    assert max(probe.counts[:k]) <= k + 1 + gradient_maps, probe.counts


@pytest.mark.parametrize("case", FUSABLE)
def test_growth_from_the_autograd_path_into_the_fused_one_is_exact(case):
    """K = 1 runs the plain autograd code, K >= 2 the fused node: growing across that line
    (and on) must leave the outputs bit-identical."""
    layer, x = build(case, 1, dtype=torch.float32)
    assert not uses_fused(layer, x)
    for seed in (5, 6):
        with torch.no_grad():
            before = layer(x)
            layer.grow(torch.Generator().manual_seed(seed))
            assert torch.equal(layer(x), before)
        assert uses_fused(layer, x)
        with torch.no_grad():  # make the grown dendrite count before the next growth
            layer.out_weight[-1].normal_(0, 0.5)
            layer.cascade[-1].normal_(0, 0.5)


# ----------------------------------------------------------------------------- gradcheck
def _spec_inputs(case: str, k: int, activation: str):
    layer, x = build(case, k, activation)
    src = layer.source
    conv = None if isinstance(src, nn.Linear) else (tuple(src.stride), tuple(src.padding),
                                                    tuple(src.dilation))
    spec = MixSpec("linear" if conv is None else "conv", activation, conv)
    y = layer.base(x).detach()
    tensors = [y, x, layer.bank_weight, layer.bank_bias, layer.cascade, layer.out_weight]
    tensors = [None if t is None else t.detach().clone().requires_grad_() for t in tensors]
    fwd = None if conv is None else src._conv_forward
    return tensors, spec, fwd


@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("case", ["linear", "linear_3d", "linear_no_bias", "conv1d",
                                  "conv2d_strided"])
def test_gradcheck(case, k, activation):
    tensors, spec, fwd = _spec_inputs(case, k, activation)

    def fn(*ts):
        return FusedMix.apply(*ts, spec, fwd)

    assert torch.autograd.gradcheck(fn, tuple(tensors), eps=1e-6, atol=1e-5)


def test_gradgradcheck():
    """create_graph=True differentiates the reference: second derivatives are right too."""
    tensors, spec, fwd = _spec_inputs("linear", 2, "tanh")

    def fn(*ts):
        return FusedMix.apply(*ts, spec, fwd)

    assert torch.autograd.gradgradcheck(fn, tuple(tensors), eps=1e-6, atol=1e-5)


def test_relu_gradcheck_away_from_the_kink():
    tensors, spec, fwd = _spec_inputs("linear", 3, "relu")
    with torch.no_grad():  # keep every pre-activation away from 0, where relu has no slope
        tensors[2].mul_(0.1)
        tensors[2][:, 0] += 3.0
        tensors[1].abs_().add_(0.5)

    def fn(*ts):
        return FusedMix.apply(*ts, spec, fwd)

    assert torch.autograd.gradcheck(fn, tuple(tensors), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("case", ["linear", "conv2d"])
def test_meta_device_gives_shapes_forward_and_backward(case):
    """Shape inference on the meta device (empty-weight init, FLOP estimates) at K >= 2:
    autocast has no meta state, which must not be an error."""
    layer, x = build(case, 3, dtype=torch.float32)
    want = layer(x).shape
    layer = layer.to("meta")
    x = torch.empty(x.shape, device="meta", requires_grad=True)
    out = layer(x)
    assert out.shape == want and out.device.type == "meta"
    assert type(out.grad_fn).__name__ == "FusedMixBackward"
    out.sum().backward()
    assert x.grad.shape == x.shape and layer.bank_weight.grad.shape == layer.bank_weight.shape


@pytest.mark.parametrize("k", [1, 2, 3])
def test_empty_batches_and_unbatched_conv_inputs(k):
    """An empty batch (the last shard of an uneven split) and an unbatched conv input
    (C, H, W), which PyTorch's convs accept, give what a batched call gives."""
    layer, x = build("conv2d", k)
    out, got = grads(layer, x[:1], lambda m, inp: m(inp))
    out_u, got_u = grads(layer, x[:1], lambda m, inp: m(inp[0]).unsqueeze(0))
    torch.testing.assert_close(out_u, out)
    for name in got:
        torch.testing.assert_close(got_u[name], got[name], msg=lambda m, n=name: f"{n}: {m}")
    for case in ("conv2d", "linear"):
        layer, x = build(case, k)
        empty = x[:0].detach().requires_grad_()
        out = layer(empty)
        assert out.shape == (0, *layer(x).shape[1:])
        out.sum().backward()
        assert empty.grad.shape == empty.shape
        assert layer.bank_weight.grad.abs().sum() == 0


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_fused_equals_autograd_over_random_layers_and_inputs(data):
    """Fused against autograd code on drawn layers and inputs: Linear (any leading dims, or
    a 1-D input) and Conv1d/2d/3d (stride, padding, dilation, bias), batches of 0 to 3,
    K = 2..4, every activation, parameters frozen at random, non-contiguous inputs."""
    kind = data.draw(st.sampled_from(["linear", "conv1d", "conv2d", "conv3d"]))
    batch, k = data.draw(st.integers(0, 3)), data.draw(st.integers(2, 4))
    activation = data.draw(st.sampled_from(list(ACTS)))
    bias = data.draw(st.booleans())
    if kind == "linear":
        features, n = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 6))
        base = nn.Linear(features, n, bias=bias)
        lead = data.draw(st.sampled_from([(), (2,), (2, 3)]))
        shape = data.draw(st.sampled_from([(batch, *lead, features), (features,)]))
        axis = -1
    else:
        dims = int(kind[-2])
        channels, n = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4))
        size, dilation = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
        base = getattr(nn, f"Conv{dims}d")(channels, n, size, stride=data.draw(st.integers(1, 2)),
                                          padding=data.draw(st.integers(0, 2)),
                                          dilation=dilation, bias=bias)
        spatial = [data.draw(st.integers(size * dilation, size * dilation + 3))
                   for _ in range(dims)]
        shape, axis = (batch, channels, *spatial), 1
    seed = data.draw(st.integers(0, 2**16))
    layer = DendriticLayer(base, num_neurons=n, neuron_axis=axis, activation=activation)
    layer.double()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(k):
        layer.grow(gen)
    with torch.no_grad():
        for p in (layer.out_weight, layer.cascade):
            if p is not None:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    for p in layer.parameters():
        p.requires_grad_(data.draw(st.integers(0, 4)) > 0)  # one in five frozen
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    if x.dim() >= 2 and data.draw(st.booleans()):
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    x_grad = data.draw(st.booleans())
    autograd_path = copy.deepcopy(layer)
    autograd_path._fused_spec = lambda *args: None
    results = []
    for m in (layer, autograd_path):
        inp = x.detach().clone().requires_grad_(x_grad)
        out = m(inp)
        if out.requires_grad:
            (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(1),
                               dtype=out.dtype)).sum().backward()
        results.append([out, inp.grad, *(p.grad for p in m.parameters())])
    for got, want in zip(*results):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want)
