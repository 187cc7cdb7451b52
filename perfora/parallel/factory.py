"""``backend_of(model)``: the parallel backend for however the model is wrapped or sharded."""

from __future__ import annotations

from torch import nn

from .base import ParallelBackend
from .ddp import DDPBackend
from .deepspeed import DeepSpeedBackend, DeepSpeedSpec
from .dp import DataParallelBackend
from .fsdp1 import FSDP1Backend, FSDP1Spec
from .fsdp2 import FSDP2Backend, FSDP2Spec
from .none import NoWrapperBackend
from .wrappers import DDP_KIND, wrapper_spec


def backend_of(model: nn.Module) -> ParallelBackend:
    """The backend that re-wraps, gathers and counts ``model`` the way it is wrapped now.

    Raises ParallelError for a model sharded by FSDP outside perfora (it cannot be
    re-sharded after a restructure)."""
    spec = wrapper_spec(model)
    if spec is None:
        return NoWrapperBackend()
    if isinstance(spec, DeepSpeedSpec):
        return DeepSpeedBackend(spec)
    if isinstance(spec, FSDP2Spec):
        return FSDP2Backend(spec)
    if isinstance(spec, FSDP1Spec):
        return FSDP1Backend(spec)
    return DDPBackend(spec) if spec.kind == DDP_KIND else DataParallelBackend(spec)
