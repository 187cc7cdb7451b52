"""Perforated models under ``torch.func`` transforms, forward-mode AD and batched gradients.

With K >= 2 dendrites a Linear/Conv layer's mix runs as one hand-written autograd node
(perfora/kernels.py), which has no batching rule and no jvp. Per-sample gradients with
``vmap(grad(...))``, ``torch.func.jvp``/``jacrev``, ``torch.autograd.forward_ad`` and
``autograd.grad(is_grads_batched=True)`` must still work and give the values that plain
backward gives, on the same model, in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, jacrev, jvp, vmap

import perfora
from perfora.nn.layers import dendritic_layers

MODELS = {
    "mlp": (lambda: nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), (5, 6)),
    "cnn": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                  nn.Linear(4 * 5 * 5, 3)), (5, 2, 5, 5)),
}


def build(name: str, k: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    model = perfora.perforate(factory()).double()
    gen = torch.Generator().manual_seed(1)
    for layer in dendritic_layers(model).values():
        for _ in range(k):
            layer.grow(gen)
        with torch.no_grad():  # every term live
            for p in (layer.out_weight, layer.cascade):
                if p is not None:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (shape[0],), generator=gen)
    return model, x, y


def fused_nodes(model: nn.Module, x: torch.Tensor) -> int:
    """How many fused mix nodes plain autograd records for one forward."""
    seen, stack, count = set(), [model(x.requires_grad_()).grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += type(node).__name__ == "FusedMixBackward"
        stack.extend(nxt for nxt, _ in node.next_functions)
    return count


def backward_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_func_grad_and_per_sample_grads_equal_backward(name, k):
    model, x, y = build(name, k)
    assert fused_nodes(model, x.clone()) == len(dendritic_layers(model))  # the fast path
    params = {n: p.detach() for n, p in model.named_parameters()}

    def loss(p, xb, yb):
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    want = backward_grads(model, x, y)
    got = grad(loss)(params, x, y)
    for n in want:
        torch.testing.assert_close(got[n], want[n], msg=lambda m, n=n: f"{n}: {m}")

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x[:, None], y[:, None])
    for i in range(x.shape[0]):
        want_i = backward_grads(model, x[i:i + 1], y[i:i + 1])
        for n in want_i:
            torch.testing.assert_close(per_sample[n][i], want_i[n],
                                       msg=lambda m, n=n, i=i: f"sample {i}, {n}: {m}")


@pytest.mark.parametrize("name", list(MODELS))
def test_forward_mode_equals_the_double_backward_jvp(name):
    model, x, y = build(name, 3)
    tangent = torch.randn(x.shape, generator=torch.Generator().manual_seed(2),
                          dtype=x.dtype)
    want = torch.autograd.functional.jvp(model, x, tangent)[1]  # through the fused node
    _, got_func = jvp(model, (x,), (tangent,))
    with fwAD.dual_level():
        got_dual = fwAD.unpack_dual(model(fwAD.make_dual(x, tangent))).tangent
    torch.testing.assert_close(got_func, want)
    torch.testing.assert_close(got_dual, want)


@pytest.mark.parametrize("name", list(MODELS))
def test_batched_gradients_equal_one_at_a_time(name):
    model, x, _ = build(name, 2)
    assert fused_nodes(model, x.clone()) == len(dendritic_layers(model))  # batched backward
    x = x.requires_grad_()
    out = model(x)
    basis = torch.eye(out.shape[1], dtype=out.dtype)[:, None].expand(-1, out.shape[0], -1)
    batched = torch.autograd.grad(out, x, basis, is_grads_batched=True, retain_graph=True)[0]
    for i in range(out.shape[1]):
        one = torch.autograd.grad(out, x, basis[i], retain_graph=True)[0]
        torch.testing.assert_close(batched[i], one)
    jac = jacrev(model)(x[:1].detach())
    torch.testing.assert_close(jac[0, :, 0], batched[:, 0])
