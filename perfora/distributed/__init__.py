"""Distributed support: rank queries, collectives, and in-process re-wrapping of DDP."""

from .collectives import (
    agree_on_scores,
    barrier,
    is_distributed,
    is_rank_zero,
    rank,
    world_size,
)
from .fingerprint import RankMismatchError, check_same_structure, structure_fingerprint
from .helpers import init_from_env, print0, set_epoch
from .wrappers import WrapperSpec, ddp_kwargs_of, wrap_ddp, wrapper_spec

__all__ = ["agree_on_scores", "barrier", "is_distributed",
           "is_rank_zero", "rank", "world_size",
           "RankMismatchError", "check_same_structure", "structure_fingerprint",
           "init_from_env", "print0", "set_epoch",
           "WrapperSpec", "ddp_kwargs_of", "wrap_ddp", "wrapper_spec"]
