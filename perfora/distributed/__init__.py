"""Distributed support: rank queries, collectives, re-wrapping DDP and re-sharding FSDP2."""

from .collectives import (
    agree_on_scores,
    barrier,
    is_distributed,
    is_rank_zero,
    rank,
    world_size,
)
from .fingerprint import RankMismatchError, check_same_structure, structure_fingerprint
from .fsdp import FSDP2Spec, full_state_dict, is_fsdp1, is_fsdp2, shard_fsdp2, wrap_fsdp1
from .helpers import init_from_env, print0, set_epoch
from .wrappers import WrapperSpec, ddp_kwargs_of, wrap_ddp, wrapper_spec

__all__ = ["agree_on_scores", "barrier", "is_distributed",
           "is_rank_zero", "rank", "world_size",
           "RankMismatchError", "check_same_structure", "structure_fingerprint",
           "FSDP2Spec", "full_state_dict", "is_fsdp1", "is_fsdp2", "shard_fsdp2", "wrap_fsdp1",
           "init_from_env", "print0", "set_epoch",
           "WrapperSpec", "ddp_kwargs_of", "wrap_ddp", "wrapper_spec"]
