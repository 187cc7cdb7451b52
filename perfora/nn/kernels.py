"""The dendrite mix of a Linear/Conv bank as one autograd node with a hand-written backward.

For a layer with K full dendrite sets (see :mod:`perfora.nn.layers`)::

    a_k = D_k(x) + sum_{j<k} w[k, j] * d_j      d_k = act(a_k)      out = y + sum_k v[k] * d_k

Eager autograd records about 4K + K(K-1)/2 nodes for this (a GEMM, an activation, the cascade's
and ``v``'s multiply-adds, each with its own backward kernels), and at small batch their
per-operator cost, not the FLOPs, sets the step time. :class:`FusedMix` records one node:

* forward runs without autograd: each dendrite's GEMM/conv on its slice of the bank (the
  same call as before, so growth stays bit-exact: a wider GEMM would round old columns
  differently), then the cascade, activation and ``v`` multiply-adds in place; only
  ``d = act(a)`` is kept for backward (every activation here has a derivative in terms of
  its output);
* backward walks the cascade once in reverse. For a Linear every ``dL/da_k`` goes into one
  ``[B, K, N]`` buffer, which *is* the gradient of the bank's output: one GEMM then gives
  the input gradient of all K dendrites, one GEMM the whole bank's weight gradient, one sum
  the bias gradient. A conv keeps each map in its own tensor (feature maps are large, and
  one K-times larger block would be mapped fresh at every step) and runs one
  ``convolution_backward`` per dendrite as soon as that dendrite's gradient is known, so
  only a few gradient maps are alive at once (see :func:`_conv_bank_backward`). ``v``'s
  gradient is one product and sum per dendrite, the cascade's one per row of its lower
  triangle.

For a Linear the GEMM count of backward no longer grows with K, and the elementwise
kernels run without autograd bookkeeping. The layer uses this path in eager mode for
Linear and ungrouped zero-padded Conv banks whose sets feed every neuron; everything else
(selective growth, a candidate trained apart, grouped or reflect-padded convs, generic
modules, autocast, ``torch.compile``/``torch.export`` tracing, ``torch.func`` transforms,
forward-mode AD) takes the plain autograd code (``row_bank.py``, ``layers.py``), which
compilers fuse by themselves and which has every batching and forward-mode rule. Tests check
both against a reference of the formula and the backward against ``torch.autograd.gradcheck``
in float64.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F


class MixSpec(NamedTuple):
    """What a fused mix needs besides tensors (hashable, so compilers may key on it)."""

    kind: str                    # "linear" or "conv"
    activation: str              # "sigmoid", "tanh" or "relu"
    conv: tuple | None = None    # (stride, padding, dilation) of the conv, ints per dim


_ACTIVATE_OUT = {"sigmoid": torch.sigmoid, "tanh": torch.tanh}
_ACTIVATE = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": F.relu}
# out = t * act'(a) from d = act(a), in one kernel: the one autograd itself would run
# (for relu, d > 0 exactly where a > 0)
_THROUGH = {"sigmoid": torch.ops.aten.sigmoid_backward.grad_input,
            "tanh": torch.ops.aten.tanh_backward.grad_input}


def functorch_active() -> bool:
    """True under a ``torch.func`` transform (grad, vmap, jvp, ...): the fused node has no
    batching or forward-mode rule, so callers take autograd code then (batched gradients
    use another mechanism: see :func:`vmapped`)."""
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active is not None and active())


def vmapped(t: torch.Tensor) -> bool:
    """A tensor batched by vmap (``is_grads_batched`` uses the legacy batching key, which no
    Python query names, so its key set is read by name; about 1 µs, once per backward)."""
    return "Batched" in str(torch._C._dispatch_keys(t))


def _activate(a: torch.Tensor, activation: str, out: torch.Tensor) -> None:
    fn = _ACTIVATE_OUT.get(activation)
    if fn is not None:
        fn(a, out=out)
    else:
        torch.clamp(a, min=0, out=out)


def _backward_through(t: torch.Tensor, d: torch.Tensor, activation: str,
                      out: torch.Tensor) -> None:
    fn = _THROUGH.get(activation)
    if fn is not None:
        fn(t, d, grad_input=out)
    else:
        torch.ops.aten.threshold_backward.grad_input(t, d, 0, grad_input=out)


def bank_pre_activations(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         k: int, spec: MixSpec, conv_forward) -> list[torch.Tensor]:
    """D_k(x) for each of the K dendrites, each by its own call on its slice of the bank:
    the same call whatever K is, so the same bits (exact growth)."""
    if k == 1:
        ws, bs = (weight,), (bias,)
    else:
        n = weight.shape[0] // k
        ws = weight.split(n)
        bs = (None,) * k if bias is None else bias.split(n)
    if spec.kind == "linear":
        return [F.linear(x, ws[i], bs[i]) for i in range(k)]
    return [conv_forward(x, ws[i], bs[i]) for i in range(k)]


def reference_mix(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None, cascade: torch.Tensor | None,
                  out_weight: torch.Tensor, spec: MixSpec, conv_forward) -> torch.Tensor:
    """The same function in differentiable torch ops (double backward, tests)."""
    k = out_weight.shape[0]
    shape = [1] * y.dim()
    axis = y.dim() - 1 if spec.kind == "linear" else 1
    shape[axis] = y.shape[axis]
    act = _ACTIVATE[spec.activation]
    pre = bank_pre_activations(x, weight, bias, k, spec, conv_forward)
    ds: list[torch.Tensor] = []
    out, row = y, 0
    for i in range(k):
        a = pre[i]
        for j in range(i):
            a = torch.addcmul(a, cascade[row].view(shape), ds[j])
            row += 1
        ds.append(act(a))
        out = torch.addcmul(out, out_weight[i].view(shape), ds[i])
    return out


class FusedMix(torch.autograd.Function):
    """``out = y + sum_k v[k] * act(D_k(x) + sum_{j<k} w[k, j] * d_j)`` as one node.

    Written for few Python-level calls (their cost is what this node saves): views come
    from one ``unbind`` or ``chunk`` each, never from indexing in a loop. A Linear's tensors
    are handled as ``[B, N]`` views, a conv's as ``[B, N, S]`` (S the spatial size).

    Buffers follow what is large. A Linear's per-dendrite tensors are small next to its
    weights: the K ``d_k`` share one ``[K, B, N]`` buffer and the K ``dL/da_k`` one
    ``[B, K*N]`` buffer, so one GEMM gives the input gradient and one the bank's weight
    gradient. A conv's feature maps are large next to its weights: each ``d_k`` and
    ``dL/da_k`` is its own tensor (the allocator reuses blocks of one feature map's size;
    one K-times larger block would be mapped fresh from the system at every step), and
    each dendrite's ``convolution_backward`` gives its rows of the bank's gradient,
    right after that dendrite's gradient is known.
    """

    @staticmethod
    def forward(ctx, y, x, weight, bias, cascade, out_weight, spec, conv_forward):
        ctx.spec = spec
        ctx.conv_forward = conv_forward
        if spec.kind == "linear":
            out, d_all = _linear_mix(y, x, weight, bias, cascade, out_weight, spec.activation)
            ctx.save_for_backward(x, weight, bias, cascade, out_weight, d_all)
            return out
        out, ds = _conv_mix(y, x, weight, bias, cascade, out_weight, spec, conv_forward)
        ctx.save_for_backward(x, weight, bias, cascade, out_weight, *ds)
        return out

    @staticmethod
    def backward(ctx, grad):
        # create_graph=True, or batched gradients (autograd.grad(is_grads_batched=True),
        # jacobian(vectorize=True): a vmap over this backward, whose out= kernels have no
        # batching rule): differentiate the reference instead
        if torch.is_grad_enabled() or functorch_active() or vmapped(grad):
            return _double_backward(ctx, grad)
        need_y, need_x, need_w, need_b, need_c, need_v = ctx.needs_input_grad[:6]
        x, weight, bias, cascade, out_weight, *saved = ctx.saved_tensors
        need = (need_x, need_w, need_b and bias is not None, need_c, need_v)
        if ctx.spec.kind == "linear":
            g_x, g_w, g_b, g_c, g_v = _linear_mix_backward(
                grad, x, weight, cascade, out_weight, saved[0], ctx.spec.activation, need)
        else:
            g_x, g_w, g_b, g_c, g_v = _conv_mix_backward(
                grad, x, weight, cascade, out_weight, saved, ctx.spec, need)
        return grad if need_y else None, g_x, g_w, g_b, g_c, g_v, None, None


def _linear_mix(y, x, weight, bias, cascade, out_weight, activation):
    """The mix of a Linear bank: ``(out, d_all)``, the K ``d_k`` in one ``[K, B, N]`` buffer.

    Per-neuron vectors (``v`` rows, cascade rows) broadcast against ``[B, N]`` views as they
    are: no reshapes in the loop, since at small batch every call counts."""
    k, n = out_weight.shape
    b = y.numel() // n
    weights = weight.chunk(k)  # the same views as a split: the same GEMMs as K = 1's
    biases = bias.chunk(k) if bias is not None else (None,) * k
    d_all = y.new_empty((k, b, n))
    ds = d_all.unbind(0)
    vs = out_weight.unbind(0)
    ws = cascade.unbind(0) if cascade is not None else ()
    y2 = y.reshape(b, n)
    out, out2 = _output_like(y, out_weight, d_all, (b, n))
    row = 0
    for i in range(k):
        a = F.linear(x, weights[i], biases[i]).view(b, n)
        for j in range(i):  # the autograd code's order: growth stays exact
            a.addcmul_(ws[row], ds[j])
            row += 1
        _activate(a, activation, ds[i])
        if i == 0:
            torch.addcmul(y2, vs[i], ds[i], out=out2)
        else:
            out2.addcmul_(vs[i], ds[i])
    return out, d_all


def _output_like(y: torch.Tensor, out_weight: torch.Tensor, d: torch.Tensor,
                 flat: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The mix's output, in ``y``'s shape, and a ``flat``-shaped view of it to write into.
    The output itself is returned, never a view: autograd forbids in-place changes to a
    view made inside a custom Function, and ``ReLU(inplace=True)`` after a layer is common."""
    out = torch.empty(y.shape, dtype=_mix_dtype(y, out_weight, d), device=y.device)
    return out, out.view(flat)


def _mix_dtype(y: torch.Tensor, out_weight: torch.Tensor, d: torch.Tensor) -> torch.dtype:
    """The dtype ``addcmul(y, v, d)`` gives (autocast can leave them different)."""
    return torch.promote_types(torch.promote_types(y.dtype, out_weight.dtype), d.dtype)


def _linear_mix_backward(grad, x, weight, cascade, out_weight, d_all, activation, need):
    """Gradients of a Linear bank's mix. Every ``dL/da_k`` goes into one ``[B, K, N]`` buffer
    laid out as the bank's output, so one GEMM gives the input gradient of all K dendrites
    and one the whole bank's weight gradient."""
    need_x, need_w, need_b, need_c, need_v = need
    k, b, n = d_all.shape
    g2 = grad.reshape(b, n)
    g_x = g_w = g_b = g_c = g_v = None
    if need_v:
        g_v = torch.mul(d_all, g2).sum(1)
    if not (need_x or need_w or need_b or need_c):
        return g_x, g_w, g_b, g_c, g_v
    ds = d_all.unbind(0)
    vs = out_weight.unbind(0)
    ws = cascade.unbind(0) if cascade is not None else ()
    g_a = grad.new_empty((b, k, n))
    gas = g_a.unbind(1)
    for i in range(k - 1, -1, -1):
        t = g2 * vs[i]
        for later in range(i + 1, k):
            t.addcmul_(gas[later], ws[later * (later - 1) // 2 + i])
        _backward_through(t, ds[i], activation, gas[i])
    if need_c and k > 1:
        g_c = torch.stack([(ds[j] * gas[i]).sum(0) for i in range(1, k) for j in range(i)])
    flat = g_a.view(b, k * n)
    if need_x:
        g_x = flat.mm(weight).view(x.shape)
    if need_w:
        g_w = flat.t().mm(x.reshape(b, x.shape[-1]))
    if need_b:
        g_b = flat.sum(0)
    return g_x, g_w, g_b, g_c, g_v


def _conv_mix(y, x, weight, bias, cascade, out_weight, spec, conv_forward):
    """The mix of a conv bank: ``(out, ds)``, each ``d_k`` in its own tensor, written over
    its pre-activation's memory. Tensors are handled as ``[B, N, S]`` views."""
    k = out_weight.shape[0]
    b, n = y.shape[0], y.shape[1]
    s = math.prod(y.shape[2:])  # not numel // (b * n): a batch may be empty
    vs = out_weight.view(k, n, 1).unbind(0)
    ws = cascade.view(-1, n, 1).unbind(0) if cascade is not None else ()
    pre = bank_pre_activations(x, weight, bias, k, spec, conv_forward)
    ds: list[torch.Tensor] = []
    out = None
    ones = (1,) * (y.dim() - 2)
    row = 0
    for i in range(k):
        a = pre[i].reshape(b, n, s)
        pre[i] = None  # d_k takes its pre-activation's memory
        for j in range(i):  # the autograd code's order: growth stays exact
            a.addcmul_(ws[row], ds[j])
            row += 1
        _activate(a, spec.activation, a)
        ds.append(a)
        # written in y's own layout (a channels_last y stays channels_last): a layer
        # after it that saw another layout would compute, and round, differently
        if out is None:
            out = torch.empty_like(y, dtype=_mix_dtype(y, out_weight, a))
            torch.addcmul(y, vs[i].view(n, *ones), a.view(y.shape), out=out)
        else:
            out.addcmul_(vs[i].view(n, *ones), a.view(y.shape))
    return out, ds


def _conv_mix_backward(grad, x, weight, cascade, out_weight, ds, spec, need):
    """Gradients of a conv bank's mix (the bank's own through :func:`_conv_bank_backward`)."""
    need_x, need_w, need_b, need_c, need_v = need
    k = out_weight.shape[0]
    b, n = grad.shape[0], grad.shape[1]
    g3 = grad.reshape(b, n, math.prod(grad.shape[2:]))
    g_v = torch.stack([(d * g3).sum((0, 2)) for d in ds]) if need_v else None
    if not (need_x or need_w or need_b or need_c):
        return None, None, None, None, g_v
    vs = out_weight.view(k, n, 1).unbind(0)
    ws = cascade.view(-1, n, 1).unbind(0) if cascade is not None else ()
    g_x, g_w, g_b, g_c = _conv_bank_backward(g3, x, weight, ds, vs, ws, spec, n,
                                             (need_x, need_w, need_b, need_c))
    return g_x, g_w, g_b, g_c, g_v


def _conv_bank_backward(g3, x, weight, ds, vs, ws, spec, n, need):
    """A conv bank's gradients, dendrite by dendrite from the last, each map freed once used.

    ``dL/da_j`` needs the gradient of every later dendrite (the cascade). Keeping all K of
    them (K feature maps next to the K saved ``d_k``) is what sets the peak. Instead, dendrite
    i's gradient runs through its ``convolution_backward`` at once, and then it is either
    held or, once the held maps would outnumber the dendrites still to come, folded with
    them into one accumulator per earlier dendrite. So few gradient maps are alive while a
    convolution backward, which has sizeable buffers of its own, runs: one for K = 2,
    two for K = 3, three for K = 5 (K for the whole bank before).
    """
    need_x, need_w, need_b, need_c = need
    k = len(vs)
    stride, padding, dilation = spec.conv
    dims = len(stride)
    shape = [x.shape[0], n, *_spatial(x, weight, spec)]
    weights = weight.split(n)
    mask = [need_x, need_w, need_b]
    acc: list[torch.Tensor | None] = [None] * k   # folded part of dL/dd_j, j below i
    held: list[tuple[int, torch.Tensor]] = []     # (h, dL/da_h) of later dendrites, unfolded
    g_x = None
    g_ws: list[torch.Tensor | None] = [None] * k
    g_bs: list[torch.Tensor | None] = [None] * k
    g_cs: list[torch.Tensor | None] = [None] * (k * (k - 1) // 2)
    for i in range(k - 1, -1, -1):
        t = _cascade_gradient(acc[i] if acc[i] is not None else g3 * vs[i], held, ws, i)
        acc[i] = None
        _backward_through(t, ds[i], spec.activation, t)  # t is now dL/da_i
        if need_c:
            for j in range(i):
                g_cs[i * (i - 1) // 2 + j] = (ds[j] * t).sum((0, 2))
        if need_x or need_w or need_b:
            gi, g_ws[i], g_bs[i] = torch.ops.aten.convolution_backward(
                t.view(shape), x, weights[i], [n] if need_b else None, list(stride),
                list(padding), list(dilation), False, [0] * dims, 1, mask)
            if need_x:
                g_x = gi if g_x is None else g_x.add_(gi)
            del gi  # not alive through the next convolution backward
        held.append((i, t))
        del t
        if len(held) >= i:  # i accumulators cost no more than the held maps: fold them
            for j in range(i):
                acc[j] = _cascade_gradient(acc[j] if acc[j] is not None else g3 * vs[j],
                                           held, ws, j)
            held.clear()
    return (g_x, torch.cat(g_ws) if need_w else None, torch.cat(g_bs) if need_b else None,
            torch.stack(g_cs) if need_c and k > 1 else None)


def _cascade_gradient(t: torch.Tensor, held: list[tuple[int, torch.Tensor]], ws,
                      j: int) -> torch.Tensor:
    """``t + sum_h w[h, j] * dL/da_h`` over the held later dendrites, in place (a function
    of its own, so no loop variable keeps a freed map alive)."""
    for h, g in held:
        t.addcmul_(g, ws[h * (h - 1) // 2 + j])
    return t


def _double_backward(ctx, grad):
    """Backward through autograd on :func:`reference_mix`, from the saved inputs themselves,
    so the gradients stay connected to the graph (create_graph=True) and every op has its
    batching rule (batched gradients). ``y`` enters the output with slope 1, so its gradient
    is ``grad`` and a zero tensor stands in for it."""
    saved = ctx.saved_tensors[:5]  # a zero y from x: one from ``grad`` would be batched too
    inputs = [saved[0].new_zeros(grad.shape), *saved]
    wanted = [i for i, (t, need) in enumerate(zip(inputs, ctx.needs_input_grad[:6]))
              if i > 0 and need and t is not None]
    grads: list[torch.Tensor | None] = [None] * 8
    if ctx.needs_input_grad[0]:
        grads[0] = grad
    if wanted:
        with torch.enable_grad():
            out = reference_mix(*inputs, ctx.spec, ctx.conv_forward)
            got = torch.autograd.grad(out, [inputs[i] for i in wanted], grad,
                                      create_graph=True, allow_unused=True)
        for i, g in zip(wanted, got):
            grads[i] = g
    return tuple(grads)


def _spatial(x: torch.Tensor, weight: torch.Tensor, spec: MixSpec) -> list[int]:
    """The conv output's spatial size for input ``x``."""
    stride, padding, dilation = spec.conv
    return [(x.shape[2 + i] + 2 * padding[i] - dilation[i] * (weight.shape[2 + i] - 1) - 1)
            // stride[i] + 1 for i in range(len(stride))]
