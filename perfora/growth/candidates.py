"""Plan a growth step from the error signal: which neurons get a dendrite, and its weights.

Cascade-Correlation's candidate training, done on the rows an :class:`ErrorSignalProbe`
kept: for every neuron a pool of candidate dendrites (the layer's default init, drawn from
the run's seeded generator) is trained for a few steps to maximise ``|cov(d, E^)|``, the
covariance of the candidate's output with the neuron's standardized error, and the best one
per neuron is kept. Its ``v`` still starts at zero, so the model's output does not change,
but the gradient on ``v`` (``E[E d]``) is as large as the pool could make it: the new dendrite
is useful from its first step. Selective growth then feeds only the neurons with the most
error that a dendrite can explain (``|corr| * std(E)``), top ``fraction`` per layer.

Under torch.distributed every rank trains the same pool (same seed) on its own rows with
all-reduced gradients, and decides from all-reduced moments: every rank grows the same
neurons with the same weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..distributed.collectives import all_reduce_values, is_distributed, world_size
from ..nn.layers import _ACTIVATIONS, DendriticLayer
from ..rules.moments import abs_correlation

WORK_PER_STEP = 2.5e8
"""Multiply-adds one candidate-training step may cost: larger layers train smaller pools."""


@dataclass
class GrowthPlan:
    """One layer's next dendrite set: the neurons it feeds and its initial weight rows."""

    neurons: list[int] | None
    weights: dict[str, torch.Tensor] | None
    neuron_scores: list[float]


def _local(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    return t


def _error_moments(e: torch.Tensor, reduce) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-neuron mean and std of the error (``reduce``: over ranks, or local)."""
    sums = reduce(torch.stack([torch.full_like(e[0], e.shape[0]), e.sum(0),
                                        e.square().sum(0)]).double())
    count, s, ss = sums.unbind(0)
    mean = s / count.clamp_min(1)
    std = (ss / count.clamp_min(1) - mean.square()).clamp_min(0).sqrt()
    return mean.float(), std.float()


def _pool_size(rows: int, features: int, neurons: int, pool: int) -> int:
    fits = int(WORK_PER_STEP // max(1, rows * features * neurons))
    return max(1, min(pool, fits))


def _draw_pool(layer: DendriticLayer, pool: int, generator: torch.Generator,
               scale: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(n, pool, features) weights and (n, pool) biases from the layer's default init."""
    src = layer.source
    n = layer.num_neurons
    features = math.prod(src.weight.shape[1:])
    bound = 1.0 / math.sqrt(max(features, 1))
    w = (torch.rand(n, pool, features, generator=generator) * 2 - 1) * bound * scale
    b = None
    if src.bias is not None:
        b = (torch.rand(n, pool, generator=generator) * 2 - 1) * bound * scale
    return w, b


def _covariances(x: torch.Tensor, e_hat: torch.Tensor, w: torch.Tensor,
                 b: torch.Tensor | None, activation: str) -> torch.Tensor:
    """Per (neuron, candidate): mean over rows of (d - mean d) * E^ (local rows)."""
    n, pool, features = w.shape
    a = (x @ w.reshape(n * pool, features).T).view(-1, n, pool)
    if b is not None:
        a = a + b
    d = _ACTIVATIONS[activation](a)
    return ((d - d.mean(0)) * e_hat.unsqueeze(-1)).mean(0)


def _moments(x: torch.Tensor, e: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
             activation: str, reduce) -> torch.Tensor:
    """[count, Sd, Se, Sdd, See, Sde] per (neuron, candidate), reduced by ``reduce``."""
    n, pool, features = w.shape
    a = (x @ w.reshape(n * pool, features).T).view(-1, n, pool)
    if b is not None:
        a = a + b
    d = _ACTIVATIONS[activation](a).double()
    ee = e.double().unsqueeze(-1)
    count = torch.full_like(d[0], d.shape[0])
    return reduce(torch.stack([count, d.sum(0), ee.sum(0).expand_as(count),
                                        d.square().sum(0),
                                        ee.square().sum(0).expand_as(count),
                                        (d * ee).sum(0)]))


def plan_growth(layer: DendriticLayer, x: torch.Tensor, e: torch.Tensor, *,
                generator: torch.Generator, fraction: float = 1.0, train_pool: bool = True,
                pool: int = 8, steps: int = 100, lr: float = 0.05,
                scale: float = 1.0, all_ranks: bool = True) -> GrowthPlan:
    """The next dendrite set of ``layer`` from its (input, error) rows ``x``, ``e``.

    ``train_pool``: choose the weights by candidate training (else the caller draws them at
    random and only the neuron choice comes from the error). ``fraction``: share of neurons
    to feed, those with the highest score. Every rank must call this with the same settings;
    ``all_ranks=False`` decides from this rank's rows alone (diagnostics only).
    """
    device = layer._reference().device  # train where the layer lives (a GPU if any)
    # frameworks decide in validation hooks, under no_grad or inference mode: train anyway
    with torch.inference_mode(False), torch.enable_grad():
        return _plan(layer, x.to(device, copy=True), e.to(device, copy=True),
                     generator=generator, fraction=fraction,
                     train_pool=train_pool, pool=pool, steps=steps, lr=lr, scale=scale,
                     reduce=all_reduce_values if all_ranks and is_distributed() else _local)


def _plan(layer: DendriticLayer, x: torch.Tensor, e: torch.Tensor, *,
          generator: torch.Generator, fraction: float, train_pool: bool, pool: int, steps: int,
          lr: float, scale: float, reduce) -> GrowthPlan:
    n = layer.num_neurons
    mean, std = _error_moments(e, reduce)
    neuron_scores = std.clone()
    weights = None
    if train_pool:
        size = _pool_size(x.shape[0], x.shape[1], n, pool)
        w0, b0 = _draw_pool(layer, size, generator, scale)  # on the CPU: same on every rank
        w0, b0 = w0.to(x.device), None if b0 is None else b0.to(x.device)
        w = w0.clone().requires_grad_(True)
        b = None if b0 is None else b0.clone().requires_grad_(True)
        e_hat = (e - mean) / torch.where(std > 0, std, 1.0)
        params = [p for p in (w, b) if p is not None]
        opt = torch.optim.Adam(params, lr=lr)
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = -_covariances(x, e_hat, w, b, layer.activation).abs().sum()
            loss.backward()
            if reduce is all_reduce_values:  # one collective for w and b together
                flat = all_reduce_values(torch.cat([p.grad.reshape(-1) for p in params]))
                for p, g in zip(params, flat.split([p.numel() for p in params])):
                    p.grad = g.view_as(p) / world_size()
            opt.step()
        with torch.no_grad():
            corr = abs_correlation(  # (n, pool), float32 as measured in the benchmark
                _moments(x, e, w, b, layer.activation, reduce)).float()
            best = corr.argmax(1)
            rows = torch.arange(n, device=x.device)
            chosen_w = w.detach()[rows, best].reshape(n, *layer.source.weight.shape[1:])
            weights = {"weight": chosen_w}
            if b is not None:
                weights["bias"] = b.detach()[rows, best]
            neuron_scores = corr[rows, best] * std
    neuron_scores = neuron_scores.cpu()
    neurons = None
    if fraction < 1.0 and layer.supports_partial_sets():
        keep = max(1, math.ceil(fraction * n))
        order = sorted(range(n), key=lambda i: (-float(neuron_scores[i]), i))
        neurons = sorted(order[:keep])
        if weights is not None:
            index = torch.tensor(neurons, device=x.device)
            weights = {k: t[index] for k, t in weights.items()}
    return GrowthPlan(neurons=neurons, weights=weights,
                      neuron_scores=[float(s) for s in neuron_scores])
