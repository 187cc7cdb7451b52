"""ZeRO-3 layer by layer: gather one layer, grow it, partition it again; never the model.

Under ZeRO-3 every rank holds a flat slice (``ds_tensor``) of each parameter. A growth step
gathers one dendritic layer whole (``deepspeed.zero.GatheredParameters``), builds a plain
copy of it from perfora's structure-only template, grows the copy, and partitions the copy's
parameters at once (DeepSpeed broadcasts rank 0's values first, so every rank agrees); the
copy then takes the old layer's place. Only one layer is ever whole. The engine is rebuilt
afterwards over the new parameters.

Best-model snapshots keep this rank's slices; the rewind rebuilds each layer from its
gathered slices (one layer at a time) and copies every other slice back in place. A
checkpoint file gathers one module at a time.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ParallelError
from ..nn.layers import dendritic_layers
from ..nn.perforation import rebuild_structure
from .base import LayerEdit, Prepare
from .shard_local import _LIVE_SETTINGS, META, _join, _set_child


class Partitions(dict):
    """A ZeRO-3 snapshot: this rank's slice of every parameter (whole buffers), with the
    parameters' full shapes in ``shapes``."""

    shapes: dict[str, tuple[int, ...]]


def _gathered(params: list[nn.Parameter]):
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def is_zero3_param(p: torch.Tensor) -> bool:
    """True for a parameter partitioned by ZeRO-3."""
    return hasattr(p, "ds_id")


def local_device(module: nn.Module) -> torch.device:
    """Where this rank's slices live."""
    for p in module.parameters():
        return p.ds_tensor.device if is_zero3_param(p) else p.device
    return torch.device("cpu")


def _plain(template: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """An uninitialized plain copy of a (meta) template layer, in the engine's dtype (the
    template keeps the dtype of the model before ``deepspeed.initialize`` cast it)."""
    return copy.deepcopy(template).to_empty(device=device).to(dtype)


def whole_layer(layer: nn.Module, template: nn.Module, device: torch.device,
                dtype: torch.dtype) -> nn.Module:
    """A plain copy of one partitioned layer (a collective: gathers this layer only)."""
    plain = _plain(template, device, dtype)
    sources = dict(layer.named_parameters())
    with _gathered(list(sources.values())), torch.no_grad():
        for name, p in plain.named_parameters():
            p.copy_(sources[name].data.view(p.shape))
            p.requires_grad_(sources[name].requires_grad)
    with torch.no_grad():
        buffers = dict(layer.named_buffers())
        for name, b in plain.named_buffers():
            b.copy_(buffers[name])
    for attr in _LIVE_SETTINGS:  # set on the live layer after the template was taken
        if hasattr(layer, attr):
            setattr(plain, attr, copy.copy(getattr(layer, attr)))
    return plain


def partition(layer: nn.Module, reference: nn.Parameter) -> None:
    """Partition ``layer``'s plain parameters the way ``reference`` was (rank 0's values are
    broadcast first); its buffers get rank 0's values too."""
    reference.convert_to_zero_parameters(param_list=list(layer.parameters()))
    if dist.is_initialized() and dist.get_world_size() > 1:
        with torch.no_grad():
            for b in layer.buffers():
                dist.broadcast(b.data, src=0)


def _reference(module: nn.Module) -> nn.Parameter:
    for p in module.parameters():
        if is_zero3_param(p):
            return p
    raise ParallelError("no ZeRO-3 parameter in the model: wrap it with perfora.wrap_deepspeed")


def edit_layers(module: nn.Module, template: nn.Module, edit: LayerEdit) -> nn.Module:
    """``edit(index, path, layer)`` on a whole copy of each dendritic layer in turn (sorted by
    path), each partitioned again before the next is gathered; returns the new template.

    ``module`` (the engine's module) is changed in place: each grown layer replaces the old.
    A collective on every rank."""
    reference = _reference(module)
    device = local_device(module)
    new_template = copy.deepcopy(template)
    templates = dendritic_layers(template)
    for index, (path, layer) in enumerate(sorted(dendritic_layers(module).items())):
        plain = whole_layer(layer, templates[path], device, reference.ds_tensor.dtype)
        edit(index, path, plain)
        new_template = _set_child(new_template, path, meta_copy(plain))
        partition(plain, reference)
        _set_child(module, path, plain)
    return new_template


def meta_copy(layer: nn.Module) -> nn.Module:
    """A structure-only (meta) copy of a plain module, with its settings: nothing allocated."""
    memo: dict[int, Any] = {}
    for p in layer.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device=META),
                                   requires_grad=p.requires_grad)
    for b in layer.buffers():
        memo[id(b)] = torch.empty_like(b, device=META)
    return copy.deepcopy(layer, memo)


def _whole_param(part: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A parameter whole from every rank's flat slice (a collective)."""
    numel = 1
    for s in shape:
        numel *= int(s)
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return part.flatten()[:numel].view(shape).clone()
    parts = [torch.empty_like(part) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, part.contiguous())
    return torch.cat([p.flatten() for p in parts])[:numel].view(shape)


def snapshot(module: nn.Module) -> Partitions:
    """This rank's slice of every parameter (cloned) and every buffer whole: no gather."""
    out = Partitions()
    out.shapes = {}
    for name, p in module.named_parameters():
        if is_zero3_param(p):
            out[name] = p.ds_tensor.detach().clone()
            out.shapes[name] = tuple(p.ds_shape)
        else:
            out[name] = p.detach().clone()
    for name, b in module.named_buffers():
        out[name] = b.detach().clone()
    return out


def whole(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A snapshot's tensors whole, in name order (a collective: one tensor at a time)."""
    shapes = getattr(tensors, "shapes", {})
    return {name: _whole_param(tensors[name], shapes[name]).cpu() if name in shapes
            else tensors[name] for name in sorted(tensors)}


def full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state_dict whole on every rank, on the CPU, gathered one submodule at
    a time (a collective)."""
    out: dict[str, torch.Tensor] = {}
    for prefix, sub in module.named_modules():
        params = {n: p for n, p in sub._parameters.items() if p is not None}
        with _gathered(list(params.values())):
            for name, p in params.items():
                out[_join(prefix, name)] = p.data.view(_shape(p)).detach().cpu().clone()
    names = list(module.state_dict().keys())
    buffers = dict(module.named_buffers())
    return {name: out[name] if name in out else buffers[name].detach().cpu().clone()
            for name in names}


def _shape(p: torch.Tensor) -> tuple[int, ...]:
    return tuple(getattr(p, "ds_shape", p.shape))


def _local_slice(value: torch.Tensor, p: nn.Parameter) -> torch.Tensor:
    """This rank's flat slice of a parameter's whole ``value``, zero-padded as ZeRO-3 pads
    the last rank's slice (each rank holds ``ds_tensor.numel()`` values, in rank order)."""
    part = p.ds_tensor
    size = part.numel()
    rank = dist.get_rank() if dist.is_initialized() else 0
    piece = value.detach().flatten()[rank * size:(rank + 1) * size]
    out = torch.zeros(size, dtype=part.dtype, device=part.device)
    out[:piece.numel()] = piece.to(part.device, part.dtype)
    return out.view_as(part)


def unpartitioned_copy(module: nn.Module, template: nn.Module) -> nn.Module:
    """A plain copy of the partitioned ``module`` on the CPU, with its full state (gathered
    one submodule at a time, a collective), its buffers (non-persistent ones too) and
    trainable flags: the model a checkpoint load changes before the engine is built again."""
    plain = copy.deepcopy(template).to_empty(device="cpu")
    state = full_state(module)
    with torch.no_grad():
        for name, tensor in [*plain.named_parameters(), *plain.named_buffers()]:
            if name in state:
                tensor.copy_(state[name])
        live = dict(module.named_buffers())
        for name, b in plain.named_buffers():
            if name not in state and name in live:
                b.copy_(live[name])
    flags = {name: p.requires_grad for name, p in module.named_parameters()}
    for name, p in plain.named_parameters():
        p.requires_grad_(flags.get(name, p.requires_grad))
    for path, layer in dendritic_layers(module).items():
        target = dendritic_layers(plain).get(path)
        for attr in _LIVE_SETTINGS:
            if target is not None and hasattr(layer, attr):
                setattr(target, attr, copy.copy(getattr(layer, attr)))
    return plain


def restore(module: nn.Module, template: nn.Module, structure: Mapping[str, Mapping],
            tensors: Mapping[str, torch.Tensor], prepare: Prepare) -> nn.Module:
    """Give ``module`` (partitioned) ``structure`` and ``tensors`` (a :class:`Partitions`
    snapshot, or whole tensors, e.g. a loaded run's best snapshot): each dendritic layer
    rebuilt whole (from its gathered slices) and partitioned again, one at a time; every
    other parameter's slice copied in place. Returns the new template."""
    whole = not isinstance(tensors, Partitions)
    shapes: dict[str, Any] = getattr(tensors, "shapes", None) or {}
    reference = _reference(module)
    device = local_device(module)
    new_template = copy.deepcopy(template)
    flags = {name: p.requires_grad for name, p in module.named_parameters()}
    for name, p in new_template.named_parameters():
        p.requires_grad_(flags.get(name, p.requires_grad))
    live = dendritic_layers(module)
    for path, layer in dendritic_layers(new_template).items():
        for attr in _LIVE_SETTINGS:
            if path in live and hasattr(live[path], attr):
                setattr(layer, attr, copy.copy(getattr(live[path], attr)))
    rebuild_structure(new_template, structure)
    prepare(new_template)
    layers = dendritic_layers(new_template)
    with torch.no_grad():
        for path in sorted(layers):
            plain = _plain(layers[path], device, reference.ds_tensor.dtype)
            for name, p in plain.named_parameters():
                key = _join(path, name)
                value = tensors[key] if whole else _whole_param(tensors[key], shapes[key])
                p.copy_(value.to(device))
            for name, b in plain.named_buffers():
                b.copy_(tensors[_join(path, name)])
            partition(plain, reference)
            _set_child(module, path, plain)
        inside = {_join(path, n) for path in layers
                  for n, _ in [*layers[path].named_parameters(), *layers[path].named_buffers()]}
        trains = {name: p.requires_grad for name, p in new_template.named_parameters()}
        for name, p in module.named_parameters():
            if name in inside:
                continue
            if is_zero3_param(p):
                p.ds_tensor.copy_(_local_slice(tensors[name], p) if whole else tensors[name])
            else:
                p.copy_(tensors[name])
            p.requires_grad_(trains.get(name, p.requires_grad))
        for name, b in module.named_buffers():
            if name not in inside and name in tensors:
                b.copy_(tensors[name])
    return new_template
