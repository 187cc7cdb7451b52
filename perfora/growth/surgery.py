"""Model surgery: change a model's dendrite structure (grow, rewind, fit a saved structure).

Every change of what a model holds goes through here: the growth step and the growth plan
it follows, the rewind to the best snapshot, fitting a saved structure before weights are
loaded (controller, :func:`save_model`/:func:`load_model`, adapters).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..checkpoint.schema import validate_structure
from ..distributed.collectives import all_reduce_values
from ..errors import PerforationError
from ..nn.layers import dendritic_layers, unwrap_model
from ..nn.perforation import fit_structure, layer_specs
from .candidates import GrowthPlan, plan_growth
from .policy import growth_may_come_next
from .state import BestSnapshot

if TYPE_CHECKING:
    from .controller import GrowthController


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


def snapshot_best(ctl: GrowthController) -> None:
    """Keep the model's structure and tensors as the best snapshot (for the rewind); under
    FSDP2 this rank's shards only."""
    ctl._best = BestSnapshot(layer_specs(unwrap_model(ctl.model)),
                             ctl.backend.snapshot(ctl.model))


def rewind_to_best(ctl: GrowthController) -> None:
    """Give the model the best snapshot's structure and weights (nothing without one)."""
    if ctl._best is None:
        return
    specs, weights = ctl._best.as_tuple()
    ctl._swap(ctl.backend.restore(ctl.model, specs, weights,
                                  lambda module: ctl.rule.apply(dendritic_layers(module))))
    ctl.state.num_dendrites = ctl._layer_dendrites()


def grow(ctl: GrowthController) -> None:
    """Add one dendrite set to every layer (seeded per layer), then rebuild what trains.

    Each layer grows on its own (under FSDP2 gathered whole one at a time, never the
    whole model)."""
    st, cfg = ctl.state, ctl.config
    counts = _probe_counts(ctl)
    init = "default" if cfg.dendrite_init == "error" else cfg.dendrite_init

    def grow_layer(index: int, path: str, layer: Any) -> None:
        seed = zlib.crc32(f"{cfg.seed}:{st.additions}:{index}:{path}".encode())
        gen = torch.Generator().manual_seed(seed)
        plan = _plan_growth(ctl, index, path, layer, counts)
        layer.grow(gen, init=init, scale=cfg.dendrite_init_scale,
                   neurons=plan.neurons if plan else None,
                   weights=plan.weights if plan else None)

    ctl._swap(ctl.backend.edit_layers(ctl.model, grow_layer))
    if ctl._probe is not None:
        ctl._probe.clear()
    layers = ctl._layers()
    st.additions += 1
    st.num_dendrites = ctl._layer_dendrites()
    st.switch_epochs.append(st.epoch)
    st.cycle_start_epoch = st.last_improved_epoch = st.epoch
    st.cycle_scores, st.cycle_best, st.cycle_set_global_best = [], None, False
    ctl.rule.after_growth(layers)
    ctl._rebuild_after_change()
    if not ctl.backend.sharded:
        ctl._usage.after_restructure(ctl._layers())


def _probe_counts(ctl: GrowthController) -> dict[str, int]:
    """Per layer, the error-signal rows every rank recorded (the minimum over ranks)."""
    if ctl._probe is None:
        return {}
    paths = sorted(ctl._layers())
    counts = torch.tensor([ctl._probe.row_count(p) for p in paths], dtype=torch.int64)
    counts = all_reduce_values(counts, "min")
    return {path: int(count) for path, count in zip(paths, counts)}


def _plan_growth(ctl: GrowthController, index: int, path: str, layer: Any,
                 counts: Mapping[str, int]) -> GrowthPlan | None:
    """The next set's neurons and weights for one layer, from the recorded error signal.

    A layer without recorded rows on some rank (or of a kind the probe cannot read)
    grows a full set with random weights, on every rank alike."""
    cfg, probe = ctl.config, ctl._probe
    if probe is None or counts.get(path, 0) < 2:
        return None
    x, e = probe.samples(path)  # type: ignore[misc]
    seed = zlib.crc32(f"{cfg.seed}:{ctl.state.additions}:{index}:{path}:pool".encode())
    return plan_growth(
        layer, x, e, generator=torch.Generator().manual_seed(seed),
        fraction=cfg.grow_fraction, train_pool=cfg.dendrite_init == "error",
        pool=cfg.candidate_pool, steps=cfg.candidate_steps, lr=cfg.candidate_lr,
        scale=cfg.dendrite_init_scale)


def arm_probe(ctl: GrowthController) -> None:
    """Record the error signal only in an epoch that a growth step may follow."""
    if ctl._probe is None:
        return
    ctl._probe.disarm()  # the layers may be new objects (FSDP2 re-shards a copy)
    if growth_may_come_next(ctl.state, ctl.config, ctl.rule.phase == ctl.rule.neuron_phase):
        ctl._probe.arm(ctl._layers())
    else:
        ctl._probe.clear()


def match_structure(ctl: GrowthController, specs: Mapping[str, Mapping[str, Any]]
                    ) -> nn.Module:
    """Give the controller's model a saved structure (checked on a weightless copy first)."""
    specs = validate_structure(specs, "structure")
    shadow = ctl.backend.shadow(ctl.model)
    if shadow is not None:
        fit_structure(shadow, specs, "the saved structure does not fit this model")
    ctl._unshard()
    fit_structure(ctl.model, specs, "the saved structure does not fit this model")
    ctl.state.num_dendrites = ctl._layer_dendrites()
    ctl.rule.apply(ctl._layers())
    ctl._sync_structure()
    return ctl.model
