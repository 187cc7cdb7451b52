"""Distributed support: rank queries, collectives, re-wrapping DDP and DeepSpeed, re-sharding FSDP.

The public namespace of :mod:`perfora.parallel` (where the code lives); import these names
from here or from ``perfora``.
"""

from ..parallel import (
    FSDP2Spec,
    RankMismatchError,
    WrapperSpec,
    agree_on_scores,
    barrier,
    check_same_structure,
    ddp_kwargs_of,
    full_state_dict,
    init_from_env,
    is_distributed,
    is_fsdp1,
    is_fsdp2,
    is_rank_zero,
    print0,
    rank,
    set_epoch,
    shard_fsdp2,
    structure_fingerprint,
    world_size,
    wrap_ddp,
    wrap_deepspeed,
    wrap_fsdp1,
    wrapper_spec,
)

__all__ = ["agree_on_scores", "barrier", "is_distributed",
           "is_rank_zero", "rank", "world_size",
           "RankMismatchError", "check_same_structure", "structure_fingerprint",
           "FSDP2Spec", "full_state_dict", "is_fsdp1", "is_fsdp2", "shard_fsdp2", "wrap_fsdp1",
           "init_from_env", "print0", "set_epoch",
           "WrapperSpec", "ddp_kwargs_of", "wrap_ddp", "wrapper_spec", "wrap_deepspeed"]
