"""Re-wrap a model after a restructure: a new DataParallel/DDP of the same kind and settings."""

from __future__ import annotations

from torch import nn

from ..errors import ParallelError
from ..parallel.factory import wrapper_spec
from ..parallel.sharded_state import ShardSpec


def rewrap(net: nn.Module) -> nn.Module:
    """``net`` itself for a plain module; a fresh wrapper of the same class and arguments
    around the (grown) inner module for DataParallel and DistributedDataParallel."""
    spec = wrapper_spec(net)
    if isinstance(spec, ShardSpec):
        raise ParallelError("the compatibility names do not re-shard FSDP2 models; use "
                            "perfora.GrowthController with perfora.shard_fsdp2, or DDP")
    return net if spec is None else spec.wrap(net.module)
