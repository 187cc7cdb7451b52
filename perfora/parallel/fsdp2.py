"""FSDP2 (``fully_shard``): a spec perfora can shard again, and its backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..errors import ParallelError
from ..layers import dendritic_layers
from .base import ShardedBackend
from .sharded_state import FSDP2_KIND, ShardSpec, is_fsdp2


def _fully_shard():
    from torch.distributed.fsdp import fully_shard

    return fully_shard


@dataclass
class FSDP2Spec(ShardSpec):
    """How to shard again: ``fully_shard`` arguments, per-layer units, an unsharded template."""

    per_layer: bool = True

    kind = FSDP2_KIND

    def sharded(self, model: nn.Module) -> bool:
        """True when ``fully_shard`` was applied to ``model`` or a submodule."""
        return is_fsdp2(model)

    def _shard(self, module: nn.Module) -> nn.Module:
        """Each dendritic layer its own unit (``per_layer``), then the whole model."""
        shard = _fully_shard()
        if self.per_layer:
            for layer in dendritic_layers(module).values():
                if layer is not module:
                    shard(layer, **self.kwargs)
        shard(module, **self.kwargs)
        return module


class FSDP2Backend(ShardedBackend):
    """FSDP2: optimizer state saved as full tensors by parameter name."""

    name = FSDP2_KIND


def shard_fsdp2(model: nn.Module, *, per_layer: bool = True, **fully_shard_kwargs: Any
                ) -> nn.Module:
    """``fully_shard`` a perforated model so that perfora can re-shard it after growth.

    Every dendritic layer becomes its own FSDP unit (``per_layer``), then the whole model;
    ``fully_shard_kwargs`` (``mesh=``, ``reshard_after_forward=``, ...) are kept and used
    again at every restructure. Rank 0's values are broadcast first. Call it on every rank,
    after :func:`perfora.perforate` and before creating the controller.
    """
    if is_fsdp2(model):
        raise ParallelError("shard_fsdp2 got a model that is already sharded with "
                            "fully_shard; give it the unsharded, perforated model")
    if not dendritic_layers(model):
        raise ParallelError("shard_fsdp2 needs a perforated model: call "
                            "perfora.perforate(model) first")
    return FSDP2Spec(dict(fully_shard_kwargs), per_layer=per_layer).wrap(model)
