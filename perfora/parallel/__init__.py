"""Parallel backends: one interface for no wrapper, DataParallel, DDP, FSDP1, FSDP2 and DeepSpeed.

Each backend declares what it can do on :class:`ParallelBackend`; the controller reads those
declarations. Rank queries and collectives live one floor below, in :mod:`perfora.distributed`.
"""

from .base import ParallelBackend
from .deepspeed import DeepSpeedSpec, wrap_deepspeed
from .factory import backend_of
from .fsdp1 import FSDP1Spec, wrap_fsdp1
from .fsdp2 import FSDP2Spec, shard_fsdp2
from .sharded_state import full_state_dict, is_fsdp1, is_fsdp2
from .wrappers import WrapperSpec, ddp_kwargs_of, wrap_ddp, wrapper_spec

__all__ = ["ParallelBackend", "backend_of",
           "FSDP1Spec", "FSDP2Spec", "full_state_dict", "is_fsdp1", "is_fsdp2", "shard_fsdp2",
           "wrap_fsdp1", "WrapperSpec", "ddp_kwargs_of", "wrap_ddp", "wrapper_spec",
           "DeepSpeedSpec", "wrap_deepspeed"]
