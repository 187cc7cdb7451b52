"""Restructure an FSDP2 model shard by shard: no rank ever holds the whole model.

A growth step changes only the dendritic layers, one at a time: perfora gathers that one
layer whole (its parameters' ``full_tensor``), grows it exactly as an unsharded layer grows,
broadcasts rank 0's result (so ranks agree whatever their seeds or data), and keeps only
this rank's chunk of each new tensor. Then it shards a structure-only copy of the model
(kept on the ``meta`` device) with the user's ``fully_shard`` arguments, allocates this
rank's shards and fills them: grown layers from the kept chunks, every other tensor from
the old model's own shard. Peak memory is the old and new shards plus one whole layer.

A rewind to the best snapshot does the same without any gather: the snapshot holds this
rank's shards of the best model (sharded clones), which fill the rebuilt model directly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from ..distributed.collectives import is_distributed
from ..distributed.fingerprint import check_same_structure
from ..errors import ParallelError
from ..nn.layers import DendriticLayer, dendritic_layers
from ..nn.perforation import rebuild_structure
from .base import LayerEdit
from .sharded_state import _local_device, chunk_for

# a layer's settings that may change after sharding (the controller sets the activation,
# the learning rule what trains, the user what stays frozen)
_LIVE_SETTINGS = ("activation", "_trainable", "frozen_base_names")
META = torch.device("meta")


def _dtensor_type() -> type:
    from torch.distributed.tensor import DTensor

    return DTensor


def _own_part(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The data for parameter ``target`` of the new model from a saved ``value``: a sharded
    value's own shard, a whole value cut to ``target``'s chunk, a plain tensor as it is."""
    dtensor = _dtensor_type()
    if isinstance(value, dtensor):
        return value.to_local()
    if isinstance(target, dtensor):
        return chunk_for(value, target.device_mesh, target.placements)
    return value


def whole_layer(layer: nn.Module, template: DendriticLayer, device: torch.device
                ) -> DendriticLayer:
    """An unsharded copy of one sharded layer (a collective: gathers this layer only)."""
    dtensor = _dtensor_type()
    plain = copy.deepcopy(template).to_empty(device=device)
    with torch.no_grad():
        sources = dict(layer.named_parameters())
        for name, p in plain.named_parameters():
            src = sources[name]
            p.copy_(src.full_tensor() if isinstance(src, dtensor) else src)
            p.requires_grad_(src.requires_grad)
        buffers = dict(layer.named_buffers())
        for name, b in plain.named_buffers():
            b.copy_(buffers[name])
    for attr in _LIVE_SETTINGS:  # set on the live layer after the template was taken
        setattr(plain, attr, copy.copy(getattr(layer, attr)))
    return plain


def _broadcast(module: nn.Module) -> None:
    """Rank 0's values of every tensor of ``module`` on every rank."""
    if not is_distributed():
        return
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)


def _set_child(root: nn.Module, path: str, child: nn.Module) -> nn.Module:
    """Put ``child`` at ``path`` inside ``root``; returns the (possibly new) root."""
    if not path:
        return child
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, name, child)
    return root


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class ShardLocalRebuild:
    """Builds a new sharded model from a structure-only (meta) template and per-tensor data."""

    def __init__(self, shard: Callable[[nn.Module], nn.Module]) -> None:
        self.shard = shard

    def build(self, template: nn.Module, device: torch.device,
              data: dict[str, torch.Tensor], flags: Mapping[str, bool]) -> nn.Module:
        """Shard a copy of ``template``, allocate this rank's shards on ``device`` and fill
        every tensor from ``data`` (by name: a shard, a whole tensor, or a buffer).

        Allocated one FSDP unit at a time, each entry of ``data`` dropped once copied: the
        new shards and the data waiting for them together stay the size of one model."""
        check_same_structure(template, "before sharding the restructured model")
        model = self.shard(copy.deepcopy(template))
        units = [path for path in sorted(dendritic_layers(model)) if path]
        for path in units:
            unit = model.get_submodule(path)
            unit.to_empty(device=device)
            _fill(unit, path, data, flags, recurse=True)
        inside = {id(m) for path in units for m in model.get_submodule(path).modules()}
        for name, module in model.named_modules():
            if id(module) not in inside:
                module.to_empty(device=device, recurse=False)
                _fill(module, name, data, flags, recurse=False)
        return model


def _fill(module: nn.Module, prefix: str, data: dict[str, torch.Tensor],
          flags: Mapping[str, bool], recurse: bool) -> None:
    """Copy each of ``module``'s tensors from ``data`` (popped), set what trains."""
    dtensor = _dtensor_type()
    with torch.no_grad():
        for name, p in module.named_parameters(recurse=recurse):
            key = _join(prefix, name)
            target = p.to_local() if isinstance(p, dtensor) else p
            source = _own_part(data.pop(key), p)
            if source.shape != target.shape:
                raise ParallelError(f"shard-local restructure: {key} needs a shard of "
                                    f"shape {tuple(target.shape)}, got {tuple(source.shape)}")
            target.copy_(source)
            p.requires_grad_(flags.get(key, p.requires_grad))
        for name, b in module.named_buffers(recurse=recurse):
            b.copy_(data.pop(_join(prefix, name)))


def edit_layers(model: nn.Module, template: nn.Module, rebuild: ShardLocalRebuild,
                edit: LayerEdit) -> tuple[nn.Module, nn.Module]:
    """Apply ``edit(index, path, layer)`` to a whole copy of each dendritic layer in turn
    (sorted by path), then rebuild the sharded model; returns (new model, new template).

    A collective on every rank. Only one layer is whole at a time; every tensor outside
    the dendritic layers keeps its own shard."""
    device = _local_device(model)
    new_template = copy.deepcopy(template)
    data: dict[str, torch.Tensor] = {}
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    shards = dendritic_layers(model)
    templates = dendritic_layers(template)
    for index, path in enumerate(sorted(shards)):
        plain = whole_layer(shards[path], templates[path], device)
        edit(index, path, plain)
        _broadcast(plain)
        old = dict(shards[path].named_parameters())
        for name, p in plain.named_parameters():
            key = _join(path, name)
            data[key] = _chunk_like(p.detach(), old.get(name), model)
            flags[key] = p.requires_grad
        for name, b in plain.named_buffers():
            data[_join(path, name)] = b.detach().clone()
        new_template = _set_child(new_template, path, plain.to(META))
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        data.setdefault(name, t.detach())
    return rebuild.build(new_template, device, data, flags), new_template


def rebuild_from(model: nn.Module, template: nn.Module, rebuild: ShardLocalRebuild,
                 structure: Mapping[str, Mapping], tensors: Mapping[str, torch.Tensor],
                 prepare: Callable[[nn.Module], None] | None = None
                 ) -> tuple[nn.Module, nn.Module]:
    """A new sharded model with ``structure`` and the values ``tensors`` (sharded clones of
    this rank, or whole tensors cut to this rank's chunks); returns (model, template).

    No gather. ``prepare(template)`` sets what trains (the learning rule) before sharding."""
    new_template = copy.deepcopy(template)
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    for name, p in new_template.named_parameters():
        p.requires_grad_(flags.get(name, p.requires_grad))
    rebuild_structure(new_template, structure)
    if prepare is not None:
        prepare(new_template)
    data = {**{name: b.detach() for name, b in model.named_buffers()}, **tensors}
    missing = [name for name, _ in [*new_template.named_parameters(),
                                    *new_template.named_buffers()] if name not in data]
    if missing:
        raise ParallelError(f"the snapshot lacks {missing[:5]}: it does not fit this model")
    trains = {name: p.requires_grad for name, p in new_template.named_parameters()}
    return rebuild.build(new_template, _local_device(model), data, trains), new_template


def sharded_clones(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of the model as this rank holds it (parameters as sharded clones)."""
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def whole_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sharded values gathered whole (a collective on every rank), in name order."""
    dtensor = _dtensor_type()
    return {name: tensors[name].full_tensor() if isinstance(tensors[name], dtensor)
            else tensors[name] for name in sorted(tensors)}


def _chunk_like(full: torch.Tensor, old: torch.Tensor | None, model: nn.Module
                ) -> torch.Tensor:
    """This rank's chunk of a grown layer's tensor, as a DTensor placed like the model's
    parameters (a plain copy when the model holds none)."""
    reference = old if isinstance(old, _dtensor_type()) else _any_dtensor(model)
    if reference is None:
        return full.clone()
    mesh, placements = reference.device_mesh, reference.placements
    local = chunk_for(full, mesh, placements).clone()
    return _dtensor_type().from_local(local, mesh, placements, shape=full.shape,
                                      stride=full.stride(), run_check=False)


def _any_dtensor(model: nn.Module) -> torch.Tensor | None:
    dtensor = _dtensor_type()
    return next((p for p in model.parameters() if isinstance(p, dtensor)), None)
