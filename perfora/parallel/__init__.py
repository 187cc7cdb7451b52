"""Parallel backends: one interface for no wrapper, DataParallel, DDP, FSDP1, FSDP2 and DeepSpeed.

Also the rank queries, collectives and helpers a training script uses under torchrun
(re-exported by :mod:`perfora.distributed`, the public namespace).
"""

from .base import ParallelBackend
from .collectives import (
    agree_on_scores,
    all_reduce_values,
    barrier,
    is_distributed,
    is_rank_zero,
    rank,
    world_size,
)
from .deepspeed import DeepSpeedSpec, wrap_deepspeed
from .factory import backend_of
from .fingerprint import RankMismatchError, check_same_structure, structure_fingerprint
from .fsdp1 import FSDP1Spec, wrap_fsdp1
from .fsdp2 import FSDP2Spec, shard_fsdp2
from .helpers import init_from_env, print0, set_epoch
from .sharded_state import full_state_dict, is_fsdp1, is_fsdp2
from .wrappers import WrapperSpec, ddp_kwargs_of, wrap_ddp, wrapper_spec

__all__ = ["ParallelBackend", "backend_of",
           "agree_on_scores", "all_reduce_values", "barrier", "is_distributed",
           "is_rank_zero", "rank", "world_size",
           "RankMismatchError", "check_same_structure", "structure_fingerprint",
           "FSDP1Spec", "FSDP2Spec", "full_state_dict", "is_fsdp1", "is_fsdp2", "shard_fsdp2",
           "wrap_fsdp1", "init_from_env", "print0", "set_epoch",
           "WrapperSpec", "ddp_kwargs_of", "wrap_ddp", "wrapper_spec",
           "DeepSpeedSpec", "wrap_deepspeed"]
