"""FSDP2 (``fully_shard``) sharding that perfora can undo and redo around a restructure.

``fully_shard`` cannot be applied twice to a module, does not broadcast rank 0's values,
and a parameter added to a sharded module is neither sharded nor reduced (see
``shared/research/distributed.md``). So perfora keeps an unsharded copy of the model as a
structural template: to restructure it gathers the full state on every rank into that copy,
grows or rewinds the copy, broadcasts rank 0's values, and shards it again with the same
arguments.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConversionError
from ..layers import dendritic_layers
from .collectives import is_distributed

FSDP2_KIND = "fsdp2"
_SPEC_ATTR = "_perfora_wrapper_spec"


def _fully_shard():
    from torch.distributed.fsdp import fully_shard

    return fully_shard


def is_fsdp2(model: nn.Module) -> bool:
    """True when ``fully_shard`` was applied to ``model`` or one of its submodules."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of a sharded model, unsharded, on every rank (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_fsdp2(model):
        return dict(model.state_dict())
    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    return dict(get_model_state_dict(model, options=options))


@dataclass
class FSDP2Spec:
    """How to shard again: ``fully_shard`` arguments, per-layer units, an unsharded template."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    per_layer: bool = True
    template: nn.Module | None = field(default=None, repr=False)
    kind: str = FSDP2_KIND

    def unshard(self, model: nn.Module) -> nn.Module:
        """An unsharded module holding ``model``'s full state (a collective on every rank)."""
        if not is_fsdp2(model):
            return model
        if self.template is None:
            raise ConversionError("perfora lost the unsharded copy of this FSDP2 model; shard "
                                  "it with perfora.distributed.shard_fsdp2")
        state = full_state_dict(model)
        plain = copy.deepcopy(self.template)
        plain.load_state_dict(state)
        flags = {n: p.requires_grad for n, p in model.named_parameters()}
        for name, p in plain.named_parameters():
            p.requires_grad_(flags.get(name, p.requires_grad))
        return plain

    def wrap(self, module: nn.Module) -> nn.Module:
        """Broadcast rank 0's values into ``module`` and shard it (a collective)."""
        if is_fsdp2(module):
            return module  # already sharded: requires_grad flips need no re-shard
        if is_distributed():
            with torch.no_grad():
                for t in [*module.parameters(), *module.buffers()]:
                    dist.broadcast(t.data, src=0)
        self.template = copy.deepcopy(module).cpu()
        shard = _fully_shard()
        if self.per_layer:
            for layer in dendritic_layers(module).values():
                if layer is not module:
                    shard(layer, **self.kwargs)
        shard(module, **self.kwargs)
        object.__setattr__(module, _SPEC_ATTR, self)
        return module


def shard_fsdp2(model: nn.Module, *, per_layer: bool = True, **fully_shard_kwargs: Any
                ) -> nn.Module:
    """``fully_shard`` a perforated model so that perfora can re-shard it after growth.

    Every dendritic layer becomes its own FSDP unit (``per_layer``), then the whole model;
    ``fully_shard_kwargs`` (``mesh=``, ``reshard_after_forward=``, ...) are kept and used
    again at every restructure. Rank 0's values are broadcast first. Call it on every rank,
    after :func:`perfora.perforate` and before creating the controller.
    """
    if is_fsdp2(model):
        raise ConversionError("shard_fsdp2 got a model that is already sharded with "
                              "fully_shard; give it the unsharded, perforated model")
    if not dendritic_layers(model):
        raise ConversionError("shard_fsdp2 needs a perforated model: call "
                              "perfora.perforate(model) first")
    return FSDP2Spec(dict(fully_shard_kwargs), per_layer).wrap(model)
