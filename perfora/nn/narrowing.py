"""Undo neuron growth: a widened layer gives back its newest neurons, and its readers their
columns, so a rewind to a narrower best model can load that model's weights in place.

Each widening (``layer.widenings``, see :mod:`perfora.nn.widening`) appended one block: k
rows to the producer (and its partners; 2k to a fused gate-and-up layer), k (times a repeat)
input columns to each consumer, k channels to a channel norm on the way, one block to a
:class:`Blockwise` wrapper. Narrowing drops the last block of each, newest widening first; a
wrapper left with one block gives back the module or function it wrapped. The values kept are
the old ones (the caller loads the saved weights afterwards); the shapes are those the layer
had before the widening.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import PerforationError
from .blocks import (
    CHANNEL_NORMS,
    TRANSPOSED_CONVS,
    Blockwise,
    is_hf_conv1d,
    same_layout,
    unblock_if_whole,
    without_last_block,
)
from .fused_record import note_fused_widenings
from .generic_widening import cut_generic_inputs, cut_generic_outputs
from .layers import DendriticLayer
from .norm_widening import shrink_norm
from .plan_types import is_grouped_conv, is_width_exact


def narrow_widenings(root: nn.Module, path: str, keep: int) -> None:
    """Undo the widenings of the layer at ``path`` beyond its first ``keep``, newest first."""
    layer = root.get_submodule(path)
    events = list(getattr(layer, "widenings", None) or [])
    if keep < 0 or keep > len(events):
        raise PerforationError(f"layer {path!r}: cannot keep {keep} of its {len(events)} "
                               "widenings")
    while len(events) > keep:
        _undo(root, path, events.pop())
        layer.widenings = list(events)
    note_fused_widenings(root)


def _undo(root: nn.Module, path: str, event: dict[str, Any]) -> None:
    """Undo one widening event of the producer at ``path`` (producers, consumers, through)."""
    k = int(event["k"])
    for producer in [path, *event.get("partners", [])]:
        _shrink_producer(root.get_submodule(producer), k * int(event.get("chunks", 1)), producer)
    for consumer, repeat in event.get("consumers", []):
        _shrink_consumer(root.get_submodule(consumer), k * int(repeat), consumer)
    for through, _axis in event.get("through", []):
        _shrink_through(root, through, k)


def _core(module: nn.Module) -> nn.Module:
    return module.source if isinstance(module, DendriticLayer) else module


def _cut_param(owner: nn.Module, name: str, dim: int, size: int,
               make: Any = None) -> None:
    """Keep the first ``size`` entries of parameter ``name`` along ``dim``."""
    old = getattr(owner, name)
    if old is None:
        return
    data = same_layout(old.detach().narrow(dim, 0, size).clone(), old)
    new = make(data) if make is not None else nn.Parameter(data, requires_grad=old.requires_grad)
    setattr(owner, name, new)


def _shrink_producer(module: nn.Module, k: int, path: str) -> None:
    core = _core(module)
    outs = without_last_block(getattr(core, "out_blocks", None), k, path)
    od = 1 if is_hf_conv1d(core) else 0
    size = core.weight.shape[od] - k
    with torch.no_grad():
        _cut_param(core, "weight", od, size)
        _cut_param(core, "bias", 0, size)
    for attr in ("out_features", "out_channels", "nf"):
        if hasattr(core, attr):
            setattr(core, attr, getattr(core, attr) - k)
    core.out_blocks = outs
    unblock_if_whole(core)
    if isinstance(module, DendriticLayer):
        if module.grouped:
            shrink_norm(module.base[1], k, path)
        _shrink_dendritic_producer(module, k, path)


def _shrink_dendritic_producer(layer: DendriticLayer, k: int, path: str) -> None:
    """Drop the new neurons' bank rows, mask columns, ``v`` and cascade columns."""
    n, kd = change_neuron_count(layer, -k)
    keep = n - k
    if kd == 0:
        return
    with torch.no_grad():
        if layer.kind == "generic":
            cut_generic_outputs(layer, keep)
        elif layer.dendrite_mask is None:
            rows = layer.bank_weight.detach().split(n)
            layer.bank_weight = layer._new_param(
                torch.cat([r.narrow(0, 0, keep) for r in rows]).clone(), "bank")
            if layer.bank_bias is not None:
                parts = layer.bank_bias.detach().split(n)
                layer.bank_bias = layer._new_param(
                    torch.cat([b.narrow(0, 0, keep) for b in parts]).clone(), "bank")
        else:
            if bool(layer.dendrite_mask[:, keep:].any()):
                raise PerforationError(f"{path}: dendrites grown after the widening feed its "
                                       "new neurons; remove those dendrite sets first")
            layer.dendrite_mask = layer.dendrite_mask[:, :keep].clone()
        _cut_columns(layer, keep)


def change_neuron_count(layer: DendriticLayer, change: int) -> tuple[int, int]:
    """Merge a candidate trained apart and change ``layer``'s neuron count by ``change`` (a
    widening's k, or a narrowing's -k); returns the neurons before and the dendrite sets."""
    if layer.has_candidate:
        layer.merge_candidate()
    n, kd = layer.num_neurons, layer.num_dendrites
    layer.num_neurons = n + change
    layer._index_cache = None
    return n, kd


def _cut_columns(layer: DendriticLayer, keep: int) -> None:
    """``v`` and the cascade keep their first ``keep`` columns."""
    _cut_param(layer, "out_weight", 1, keep, lambda d: layer._new_param(d, "out"))
    _cut_param(layer, "cascade", 1, keep, lambda d: layer._new_param(d, "cascade"))


def _shrink_depthwise(module: nn.Module, k: int, path: str) -> None:
    """A depthwise conv a widening passed through gives back its k newest channels (and a
    dendritic one its sets' rows for them)."""
    core = _core(module)
    outs = without_last_block(getattr(core, "out_blocks", None), k, path)
    size = core.weight.shape[0] - k
    with torch.no_grad():
        _cut_param(core, "weight", 0, size)
        _cut_param(core, "bias", 0, size)
    for attr in ("in_channels", "out_channels", "groups"):
        setattr(core, attr, getattr(core, attr) - k)
    core.out_blocks = outs
    unblock_if_whole(core)
    if not isinstance(module, DendriticLayer):
        return
    if module.grouped:
        shrink_norm(module.base[1], k, path)
    n, kd = change_neuron_count(module, -k)
    if kd == 0:
        return
    with torch.no_grad():
        cut = {"bank_weight": module.bank_weight, "bank_bias": module.bank_bias}
        for name, t in cut.items():
            if t is not None:
                rows = t.detach().unflatten(0, (n, kd, 1))[:n - k].flatten(0, 2).clone()
                setattr(module, name, module._new_param(rows, "bank"))
        _cut_columns(module, n - k)


def _shrink_consumer(module: nn.Module, extra: int, path: str) -> None:
    core = _core(module)
    ins = without_last_block(getattr(core, "in_blocks", None), extra, path)
    in_dim = 0 if is_hf_conv1d(core) or isinstance(core, TRANSPOSED_CONVS) else 1
    with torch.no_grad():
        _cut_param(core, "weight", in_dim, core.weight.shape[in_dim] - extra)
        if isinstance(module, DendriticLayer):
            if module.has_candidate:
                module.merge_candidate()
            bank = getattr(module, "bank_weight", None)
            if module.kind == "generic" and module.num_dendrites:
                cut_generic_inputs(module, core.weight.shape[in_dim])
            elif bank is not None:
                _cut_param(module, "bank_weight", 1, bank.shape[1] - extra,
                           lambda d: module._new_param(d, "bank"))
    for attr in ("in_features", "in_channels"):
        if hasattr(core, attr):
            setattr(core, attr, getattr(core, attr) - extra)
    core.in_blocks = ins
    unblock_if_whole(core)


def _shrink_through(root: nn.Module, path: str, k: int) -> None:
    """A channel norm gives back k channels; a Blockwise wrapper its last block (and, left with
    one, its place to the module or function it wraps)."""
    parent_path, _, attr = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    target = getattr(parent, attr)
    if isinstance(target, CHANNEL_NORMS):
        shrink_norm(target, k, path)
        return
    if is_grouped_conv(target):
        _shrink_depthwise(target, k, path)
        return
    if is_width_exact(target):
        return  # a widening left it as it was
    if not isinstance(target, Blockwise):
        raise PerforationError(f"{path}: expected the block-wise wrapper a widening left, "
                               f"found a {type(target).__name__}")
    target.out_blocks = without_last_block(target.out_blocks, k, path)
    if len(target.out_blocks) > 1:
        return
    if isinstance(target.fn, nn.Module):
        parent._modules[attr] = target.fn  # in place: a Sequential keeps its order
    else:
        del parent._modules[attr]
        setattr(parent, attr, target.fn)
