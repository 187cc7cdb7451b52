"""Widen an FSDP2 model one layer pair at a time: no rank ever holds the whole model.

A neuron step changes a producer, the layers that read it, and the norms between them.
For each such pair in turn, perfora gathers only those modules whole (their parameters'
``full_tensor``) inside a structure-only copy of the model (the rest stays on the ``meta``
device), widens them exactly as an unsharded model is widened, broadcasts rank 0's
parameters, and keeps this rank's chunk of each new tensor. Buffers (a norm's running
statistics, which FSDP2 leaves to each rank) keep each rank's own values, extended alike.
The next pair reads what an earlier pair already widened from those chunks. Then the model
is sharded again from the structure, as after a dendrite step. Peak memory per rank: the
old and new shards plus one pair whole.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from ..distributed.collectives import is_distributed
from ..nn.consumers import LayerPlan
from ..nn.layers import dendritic_layers
from .shard_local import (
    _LIVE_SETTINGS,
    META,
    ShardLocalRebuild,
    _chunk_like,
    _dtensor_type,
    _join,
)
from .sharded_state import _local_device


def pair_paths(entry: LayerPlan) -> list[str]:
    """The modules one widening changes (producer, partners, consumers, what lies between),
    outermost only, in a fixed order (every rank gathers them alike)."""
    paths = sorted({entry.path, *entry.partners, *(p for p, _ in entry.consumers),
                    *(p for p, _ in entry.through)})
    return [p for p in paths if not any(p.startswith(f"{q}.") for q in paths if q != p)]


class PairwiseWidening:
    """The state of one neuron step on a sharded model: a structure-only copy to widen in,
    and the new tensors (this rank's chunks) of every module widened so far."""

    def __init__(self, model: nn.Module, template: nn.Module) -> None:
        self.model = model
        self.device = _local_device(model)
        self.template = copy.deepcopy(template)
        modes = {name: m.training for name, m in model.named_modules()}
        for name, module in self.template.named_modules():  # train/eval as the live model
            module.training = modes.get(name, module.training)
        live = dendritic_layers(model)
        for path, layer in dendritic_layers(self.template).items():
            for attr in _LIVE_SETTINGS:  # set on the live layers after the template was taken
                setattr(layer, attr, copy.copy(getattr(live[path], attr)))
        self.data: dict[str, torch.Tensor] = {}
        self.flags = {name: p.requires_grad for name, p in model.named_parameters()}
        self._old = {**dict(model.named_parameters()), **dict(model.named_buffers())}

    def _current(self, name: str) -> torch.Tensor:
        return self.data[name] if name in self.data else self._old[name]

    @contextlib.contextmanager
    def scope(self, entry: LayerPlan) -> Iterator[nn.Module]:
        """The structure-only model with the modules of ``entry`` whole (a collective);
        on exit they are cut back to this rank's chunks and leave the structure again."""
        dtensor = _dtensor_type()
        paths = [p for p in pair_paths(entry) if is_module(self.template, p)]
        with torch.no_grad():
            for path in paths:
                module = self.template.get_submodule(path)
                module.to_empty(device=self.device)
                for name, p in module.named_parameters():
                    src = self._current(_join(path, name))
                    p.copy_(src.full_tensor() if isinstance(src, dtensor) else src)
                for name, b in module.named_buffers():
                    b.copy_(self._current(_join(path, name)))
        yield self.template
        for path in pair_paths(entry):
            if not is_module(self.template, path):
                continue
            module = self.template.get_submodule(path)
            _broadcast_parameters(module)
            for name, p in module.named_parameters():
                key = _join(path, name)
                self.data[key] = _chunk_like(p.detach(), self._old.get(key), self.model)
                self.flags[key] = p.requires_grad
            for name, b in module.named_buffers():
                self.data[_join(path, name)] = b.detach().clone()
            module.to(META)

    def finish(self, rebuild: ShardLocalRebuild) -> tuple[nn.Module, nn.Module]:
        """The new sharded model and its structure-only template."""
        for name, t in self._old.items():
            self.data.setdefault(name, t.detach())
        self._old = {}
        return rebuild.build(self.template, self.device, self.data, self.flags), self.template


def _broadcast_parameters(module: nn.Module) -> None:
    """Rank 0's values of ``module``'s parameters on every rank (its buffers stay local)."""
    if is_distributed():
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p.data, src=0)


def is_module(root: nn.Module, path: str) -> bool:
    """True when ``path`` names a submodule (a widening may pass a function attribute)."""
    try:
        return isinstance(root.get_submodule(path), nn.Module)
    except AttributeError:
        return False
