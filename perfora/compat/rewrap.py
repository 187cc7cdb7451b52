"""Re-wrap a model after a restructure: a new DataParallel/DDP of the same kind and settings."""

from __future__ import annotations

from torch import nn

from ..errors import ParallelError
from ..parallel.factory import wrapper_spec
from ..parallel.sharded_state import ShardSpec, is_fsdp2

_NO_FSDP2 = ("the compatibility names do not re-shard FSDP2 models; use "
             "perfora.GrowthController with perfora.shard_fsdp2, or DDP")


def refuse_fsdp2(net: nn.Module, call: str) -> None:
    """ParallelError when ``fully_shard`` was applied to ``net`` (or inside it): the same on
    every rank, before any rank reaches a collective the others would not."""
    if is_fsdp2(net):
        raise ParallelError(f"GPA.pai_tracker.{call}: {_NO_FSDP2}")


def rewrap(net: nn.Module) -> nn.Module:
    """``net`` itself for a plain module; a fresh wrapper of the same class and arguments
    around the (grown) inner module for DataParallel and DistributedDataParallel."""
    spec = wrapper_spec(net)
    if isinstance(spec, ShardSpec):
        raise ParallelError(_NO_FSDP2)
    return net if spec is None else spec.wrap(net.module)
