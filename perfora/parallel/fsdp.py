"""FSDP1 and FSDP2 in one namespace: what the old ``perfora.distributed.fsdp`` path held."""

from __future__ import annotations

from .fsdp1 import FSDP1Backend, FSDP1Spec, wrap_fsdp1
from .fsdp2 import FSDP2Backend, FSDP2Spec, shard_fsdp2
from .sharded_state import (
    FSDP1_KIND,
    FSDP2_KIND,
    ShardSpec,
    full_state_dict,
    gather_optimizer_state,
    is_fsdp1,
    is_fsdp2,
    local_shard,
    optimizer_param_names,
    shard_optimizer_state,
)

__all__ = ["FSDP1_KIND", "FSDP2_KIND", "FSDP1Backend", "FSDP1Spec", "FSDP2Backend",
           "FSDP2Spec", "ShardSpec", "full_state_dict", "gather_optimizer_state", "is_fsdp1",
           "is_fsdp2", "local_shard", "optimizer_param_names", "shard_fsdp2",
           "shard_optimizer_state", "wrap_fsdp1"]
