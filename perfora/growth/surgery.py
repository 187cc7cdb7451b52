"""Model surgery: change a model's dendrite structure (grow, rewind, fit a saved structure).

Every change of what a model holds goes through here: the growth step and the growth plan
it follows, the rewind to the best snapshot, fitting a saved structure before weights are
loaded (controller, :func:`save_model`/:func:`load_model`, adapters). Each function takes
the parts it changes or reads (the model, its parallel backend, the state, the rule, the
error-signal probe) and returns the model to train from then on; the caller adopts it and
rebuilds what trains.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..checkpoint.schema import validate_structure
from ..config import PerforaConfig
from ..distributed.collectives import all_reduce_values
from ..errors import PerforationError
from ..nn.fused_record import note_fused_widenings
from ..nn.layers import dendritic_layers, unwrap_model
from ..nn.perforation import fit_structure, layer_specs
from ..parallel.base import ParallelBackend
from ..rules.base import LearningRule
from .candidates import GrowthPlan, plan_growth
from .policy import growth_may_come_next
from .signal import ErrorSignalProbe
from .state import BestSnapshot, ControllerState

_MISFIT = "the saved structure does not fit this model"


def apply_activation(layers: Mapping[str, Any], activation: str | None) -> None:
    """Give every wrapped layer the configured dendrite nonlinearity (None: keep theirs)."""
    if activation is None:
        return
    for path, layer in layers.items():
        if layer.activation == activation:
            continue
        if layer.num_dendrites:
            raise PerforationError(f"layer {path!r} already holds {layer.activation} dendrites; "
                                   f"the setting activation={activation!r} cannot change them "
                                   "(leave activation unset to keep the model's)")
        layer.activation = activation


def snapshot_best(model: nn.Module, backend: ParallelBackend) -> BestSnapshot:
    """The model's structure and tensors, kept as the best snapshot (for the rewind); under
    FSDP2 this rank's shards only."""
    return BestSnapshot(layer_specs(unwrap_model(model)), backend.snapshot(model))


def rewind_to_best(model: nn.Module, backend: ParallelBackend, rule: LearningRule,
                   state: ControllerState, best: BestSnapshot) -> nn.Module:
    """The model with the best snapshot's structure and weights, its trainables set by
    ``rule`` (a new model where the backend rebuilds it); counts its dendrites in state."""
    specs, weights = best.as_tuple()
    model = backend.restore(model, specs, weights,
                            lambda module: rule.apply(dendritic_layers(module)))
    count_structure(state, model)
    return model


def grow(model: nn.Module, backend: ParallelBackend, config: PerforaConfig,
         state: ControllerState, probe: ErrorSignalProbe | None) -> nn.Module:
    """Add one dendrite set to every layer (seeded per layer) and record the growth step in
    state; returns the grown model (the caller sets and rebuilds what trains).

    Each layer grows on its own (under FSDP2 gathered whole one at a time, never the
    whole model); with a probe, each set follows the plan the recorded error signal gives."""
    counts = probe_counts(probe, model)
    init = "default" if config.dendrite_init == "error" else config.dendrite_init

    def grow_layer(index: int, path: str, layer: Any) -> None:
        gen = torch.Generator().manual_seed(layer_seed(config, state, index, path))
        plan = plan_layer_growth(config, state.additions, probe, index, path, layer, counts)
        layer.grow(gen, init=init, scale=config.dendrite_init_scale,
                   neurons=plan.neurons if plan else None,
                   weights=plan.weights if plan else None)

    model = backend.edit_layers(model, grow_layer)
    if probe is not None:
        probe.clear()
    record_growth(state, model)
    return model


def describe_newest_sets(layers: Mapping[str, Any]) -> str:
    """Where the newest dendrite sets went when some feed only chosen neurons (selective
    growth), e.g. '0: 4 of 8 neurons, 2: 1 of 2 neurons'; empty when every one is full."""
    parts = []
    for path, layer in layers.items():
        fed = layer.set_neurons() if layer.num_dendrites else None
        if fed is not None and len(fed[-1]) < layer.num_neurons:
            parts.append(f"{path}: {len(fed[-1])} of {layer.num_neurons} neurons")
    return ", ".join(parts)


def layer_seed(config: PerforaConfig, state: ControllerState, index: int, path: str) -> int:
    """The seed of a layer's new dendrite weights at this growth step (the same on every
    rank)."""
    return zlib.crc32(f"{config.seed}:{state.additions}:{index}:{path}".encode())


def record_growth(state: ControllerState, model: nn.Module, kind: str = "dendrites") -> None:
    """Count a growth step of ``kind`` in ``state``: what the model holds now, and a new
    cycle."""
    state.additions += 1
    count_structure(state, model)
    state.switch_epochs.append(state.epoch)
    state.growth_kinds.append(kind)
    state.cycle_start_epoch = state.last_improved_epoch = state.epoch
    state.cycle_scores, state.cycle_best, state.cycle_set_global_best = [], None, False


def count_structure(state: ControllerState, model: nn.Module) -> None:
    """Dendrite sets, neuron steps and growth steps the model holds, into ``state``."""
    layers = dendritic_layers(unwrap_model(model)).values()
    state.num_dendrites = max((layer.num_dendrites for layer in layers), default=0)
    state.num_widenings = max((len(getattr(layer, "widenings", None) or [])
                               for layer in layers), default=0)
    state.num_steps = max((layer.num_dendrites + len(getattr(layer, "widenings", None) or [])
                           for layer in layers), default=0)
    note_fused_widenings(model)  # a save_pretrained folder then says how fused layers grew


def probe_counts(probe: ErrorSignalProbe | None, model: nn.Module) -> dict[str, int]:
    """Per layer, the error-signal rows every rank recorded (the minimum over ranks)."""
    if probe is None:
        return {}
    paths = sorted(dendritic_layers(model))
    counts = torch.tensor([probe.row_count(p) for p in paths], dtype=torch.int64)
    counts = all_reduce_values(counts, "min")
    return {path: int(count) for path, count in zip(paths, counts)}


def plan_layer_growth(config: PerforaConfig, additions: int, probe: ErrorSignalProbe | None,
                 index: int, path: str, layer: Any, counts: Mapping[str, int]
                 ) -> GrowthPlan | None:
    """The next set's neurons and weights for one layer, from the recorded error signal.

    A layer without recorded rows on some rank (or of a kind the probe cannot read, or whose
    width changed since they were recorded: a rewind past a widening) grows a full set with
    random weights, on every rank alike. ``layer`` holds its full parameters."""
    if probe is None or counts.get(path, 0) < 2:
        return None
    x, e = probe.samples(path)  # type: ignore[misc]
    if x.shape[-1] != math.prod(layer.source.weight.shape[1:]) \
            or e.shape[-1] != layer.num_neurons:
        return None
    seed = zlib.crc32(f"{config.seed}:{additions}:{index}:{path}:pool".encode())
    return plan_growth(
        layer, x, e, generator=torch.Generator().manual_seed(seed),
        fraction=config.grow_fraction, train_pool=config.dendrite_init == "error",
        pool=config.candidate_pool, steps=config.candidate_steps, lr=config.candidate_lr,
        scale=config.dendrite_init_scale)


def arm_probe(probe: ErrorSignalProbe | None, model: nn.Module, state: ControllerState,
              config: PerforaConfig, rule: LearningRule) -> None:
    """Record the error signal only in an epoch that a growth step may follow, and only that
    epoch's: what an epoch that grew nothing recorded is dropped (a checkpoint does not keep
    it, so a resumed run would not have it)."""
    if probe is None:
        return
    probe.disarm()  # the layers may be new objects (FSDP2 re-shards a copy)
    probe.clear()
    if growth_may_come_next(state, config, rule.phase == rule.neuron_phase):
        probe.arm(dendritic_layers(model))


def match_structure(model: nn.Module, backend: ParallelBackend, state: ControllerState,
                    specs: Mapping[str, Mapping[str, Any]]) -> nn.Module:
    """The model with a saved structure (checked on a weightless copy first), unsharded
    (a copy under FSDP; the caller sets what trains and shards it again); counts its
    dendrites in state."""
    specs = validate_structure(specs, "structure")
    shadow = backend.shadow(model)
    if shadow is not None:
        fit_structure(shadow, specs, _MISFIT)
    model = backend.unshard(model)
    fit_structure(model, specs, _MISFIT)
    count_structure(state, model)
    return model

