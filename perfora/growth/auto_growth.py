"""growth='auto': per layer, grow a dendrite set or neurons, whichever the recorded error says
pays more per added parameter.

Both kinds add features whose outgoing weights start at zero, so both are scored the same
way: the squared gradient those outgoing weights get from a new feature of unit variance (the
first-order rate at which it can lower the loss), per parameter added.

* A dendrite set: the trained candidate of each neuron ``j`` (Cascade-Correlation, see
  :mod:`perfora.growth.candidates`), ``d_j``, scores ``E[e_j d_j]^2 / E[d_j^2]`` on the rows
  the error probe kept (``e``: the error at the layer's output); summed over the neurons fed.
* k neurons: the GradMax directions ``w_i`` of ``M = E[g x^T]`` (``g``: the error at the
  consumer's output) score ``|M w_i|^2 / (w_i^T E[x x^T] w_i)``, summed over the k.

Every statistic is reduced over ranks first, so every rank makes the same choice. A layer at
``max_dendrites`` can only gain neurons; one that cannot gain neurons can only gain dendrites;
one with no score for either grows nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import PerforaConfig
from ..distributed.collectives import all_reduce_values, is_distributed
from ..nn.layers import _ACTIVATIONS, DendriticLayer, dendritic_layers, unwrap_model
from ..nn.widening import gradmax_rows
from ..parallel.base import ParallelBackend
from . import surgery
from .candidates import GrowthPlan
from .neuron_growth import (
    grow_neurons,
    reduce_signal,
    step_size,
    widen_layers,
    widening_targets,
)
from .signal import ErrorSignalProbe
from .state import ControllerState
from .widening_signal import WideningSignal


@dataclass
class AutoChoice:
    """What one auto step grew per layer, with both scores (per parameter)."""

    grown: dict[str, str] = field(default_factory=dict)
    scores: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def describe(self) -> str:
        """e.g. '0: neurons +8 (1.2e-05 vs dendrites 3.4e-06), 2: dendrites (...)'."""
        parts = []
        for path, what in self.grown.items():
            d, n = self.scores.get(path, (None, None))
            parts.append(f"{path}: {what} (per param: neurons {_fmt(n)}, dendrites {_fmt(d)})")
        return ", ".join(parts)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def dendrite_score(layer: DendriticLayer, plan: GrowthPlan | None, x: torch.Tensor | None,
                   e: torch.Tensor | None) -> float | None:
    """Sum over the neurons fed of ``E[e d]^2 / E[d^2]``, per parameter the set adds (None
    without a trained plan). A collective under torch.distributed (every rank calls it)."""
    usable = plan is not None and plan.weights is not None and x is not None and e is not None
    features = math.prod(layer.source.weight.shape[1:])
    neurons = plan.neurons if usable and plan.neurons is not None else \
        list(range(layer.num_neurons))
    n = len(neurons)
    sums = torch.zeros(3, max(n, 1), dtype=torch.float64)
    if usable:
        w = plan.weights["weight"].reshape(n, features).to(x)
        a = x @ w.T
        if "bias" in plan.weights:
            a = a + plan.weights["bias"].to(x)
        d = _ACTIVATIONS[layer.activation](a).double()
        err = e[:, neurons].double()
        sums = torch.stack([(err * d).sum(0), d.square().sum(0),
                            torch.full((n,), float(d.shape[0]), dtype=torch.float64)]).cpu()
    flag = torch.tensor([1.0 if usable else 0.0], dtype=torch.float64)
    reduced = all_reduce_values(torch.cat([flag, sums.reshape(-1)])) if is_distributed() \
        else torch.cat([flag, sums.reshape(-1)])
    if reduced[0] < (torch.distributed.get_world_size() if is_distributed() else 1):
        return None  # some rank has no plan: score it nowhere
    ed, dd, count = reduced[1:].reshape(3, -1)
    explained = float(((ed / count) ** 2 / (dd / count).clamp_min(1e-300)).sum())
    params = n * (features + (1 if layer.source.bias is not None else 0)) + n
    return explained / params


def neuron_score(m: torch.Tensor, xx: torch.Tensor, k: int, consumer_width: int) -> float:
    """Sum over the k GradMax directions of ``|M w|^2 / (w^T E[x x^T] w)``, per parameter
    the k neurons add (incoming row and bias, outgoing column)."""
    rows = gradmax_rows(m, k, 1.0)
    gain = (rows @ m.T).square().sum(1)
    spread = ((rows @ xx) * rows).sum(1).clamp_min(1e-300)
    return float((gain / spread).sum()) / (k * (m.shape[1] + 1 + consumer_width))


def grow_auto(model: nn.Module, backend: ParallelBackend, config: PerforaConfig,
              state: ControllerState, probe: ErrorSignalProbe | None,
              signal: WideningSignal | None) -> tuple[nn.Module, AutoChoice]:
    """One auto step: score both kinds per layer, grow dendrite sets where they win (or where
    neurons cannot grow), then widen where neurons win. Returns the model and the choice."""
    inner = unwrap_model(model)
    targets = widening_targets(inner)
    sums = reduce_signal(signal, inner, targets)
    counts = surgery.probe_counts(probe, model)
    choice = AutoChoice()
    plans: dict[str, Any] = {}
    for index, (path, layer) in enumerate(sorted(dendritic_layers(inner).items())):
        may_dendrite = layer.num_dendrites < config.max_dendrites
        plan = surgery.plan_layer_growth(config, state.additions, probe, index, path, layer,
                                    counts) if may_dendrite else None
        rows = probe.samples(path) if probe is not None and plan is not None else None
        d = dendrite_score(layer, plan, *(rows or (None, None))) if may_dendrite else None
        n = None
        if path in targets and path in sums:
            consumer = inner.get_submodule(targets[path].consumers[0][0])
            core = consumer.source if isinstance(consumer, DendriticLayer) else consumer
            n = neuron_score(*sums[path], step_size(layer, config), int(core.weight.shape[0]))
        choice.scores[path] = (d, n)
        if n is not None and (d is None or n >= d):
            choice.grown[path] = "neurons"
        elif may_dendrite and (d is not None or path not in targets):
            choice.grown[path] = "dendrites"
            plans[path] = plan
    init = "default" if config.dendrite_init == "error" else config.dendrite_init
    for index, (path, layer) in enumerate(sorted(dendritic_layers(inner).items())):
        if choice.grown.get(path) == "dendrites":
            plan = plans[path]
            gen = torch.Generator().manual_seed(surgery.layer_seed(config, state, index, path))
            layer.grow(gen, init=init, scale=config.dendrite_init_scale,
                       neurons=plan.neurons if plan else None,
                       weights=plan.weights if plan else None)
    step = widen_layers(inner, config, state, targets,
                        [p for p, what in choice.grown.items() if what == "neurons"], sums)
    for path, (k, how) in step.added.items():
        choice.grown[path] = f"neurons +{k} {how}"
    for cleared in (probe, signal):
        if cleared is not None:
            cleared.clear()
    surgery.record_growth(state, inner)
    return model, choice


def grow_beyond_dendrites(model: nn.Module, backend: ParallelBackend, config: PerforaConfig,
                          state: ControllerState, probe: ErrorSignalProbe | None,
                          signal: WideningSignal | None) -> tuple[nn.Module, str]:
    """A growth step of ``growth='neurons'`` or ``'auto'``: the model and what it added.
    A sharded model is gathered whole first (a collective); the caller shards it again."""
    model = backend.unshard(model)
    if config.growth == "auto":
        model, choice = grow_auto(model, backend, config, state, probe, signal)
        return model, choice.describe()
    return model, grow_neurons(model, config, state, signal).describe()
