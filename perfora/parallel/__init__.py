"""Parallel backends: one interface for no wrapper, DataParallel, DDP, FSDP1, FSDP2 and DeepSpeed.

Each backend declares what it can do on :class:`ParallelBackend`; the controller reads those
declarations. This package exports the backends and the wrappers perfora can build again;
rank queries and collectives live one floor below, in :mod:`perfora.distributed`.
"""

from .base import ParallelBackend
from .deepspeed import DeepSpeedBackend, DeepSpeedSpec, wrap_deepspeed
from .factory import backend_of, wrapper_spec
from .fsdp1 import FSDP1Backend, FSDP1Spec, wrap_fsdp1
from .fsdp2 import FSDP2Backend, FSDP2Spec, shard_fsdp2
from .replicated import DataParallelBackend, DDPBackend, NoWrapperBackend, ReplicatedBackend
from .sharded import ShardedBackend
from .wrappers import WrapperSpec, wrap_ddp

__all__ = ["ParallelBackend", "backend_of", "wrapper_spec",
           "ReplicatedBackend", "NoWrapperBackend", "DataParallelBackend", "DDPBackend",
           "ShardedBackend", "FSDP1Backend", "FSDP2Backend", "DeepSpeedBackend",
           "WrapperSpec", "wrap_ddp", "FSDP1Spec", "wrap_fsdp1", "FSDP2Spec", "shard_fsdp2",
           "DeepSpeedSpec", "wrap_deepspeed"]
