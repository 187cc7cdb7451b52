"""How a model is wrapped or sharded (``wrapper_spec``), and the backend for it (``backend_of``)."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..errors import ParallelError
from .base import ParallelBackend
from .deepspeed import DeepSpeedBackend, DeepSpeedSpec
from .deepspeed_config import is_deepspeed_engine, is_partitioned
from .fsdp1 import FSDP1Backend, FSDP1Spec
from .fsdp2 import FSDP2Backend, FSDP2Spec
from .replicated import DataParallelBackend, DDPBackend, NoWrapperBackend
from .sharded_state import _SPEC_ATTR, fsdp_classes
from .wrappers import DDP_KIND, DP_KIND, WrapperSpec, ddp_kwargs_of


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


def wrapper_spec(model: nn.Module
                 ) -> WrapperSpec | FSDP2Spec | FSDP1Spec | DeepSpeedSpec | None:
    """How ``model``'s outer wrapper was built (None for a bare module)."""
    spec = getattr(model, _SPEC_ATTR, None)
    if isinstance(spec, WrapperSpec | FSDP2Spec | FSDP1Spec | DeepSpeedSpec):
        return spec
    if is_deepspeed_engine(model):
        raise ParallelError(
            "this DeepSpeed engine was built with deepspeed.initialize, not through perfora: "
            "perfora cannot rebuild it after adding dendrites (it would need the optimizer "
            "recipe, and the engine's parameter partitions and hooks cover only the old "
            "parameters). Build it with perfora.wrap_deepspeed(model, config, "
            "optimizer=<class>, optimizer_args={...}) instead")
    if is_partitioned(model):
        raise ParallelError(
            "this model's parameters are partitioned by DeepSpeed (deepspeed.zero.Init or an "
            "engine perfora did not build): perfora cannot grow them in place. Build the "
            "model without zero.Init, perforate it and wrap it with perfora.wrap_deepspeed")
    if isinstance(model, DistributedDataParallel):
        hooks = list(getattr(model, "_comm_hooks", []))
        return WrapperSpec(DDP_KIND, ddp_kwargs_of(model), hooks)
    if isinstance(model, nn.DataParallel):
        # without an accelerator DataParallel keeps neither output_device nor dim
        kw = {"device_ids": getattr(model, "device_ids", None) or None,
              "output_device": getattr(model, "output_device", None),
              "dim": getattr(model, "dim", 0)}
        return WrapperSpec(DP_KIND, kw)
    if _is_sharded(model):
        raise ParallelError(
            "this model is sharded with FSDP, but not through perfora: perfora cannot re-shard "
            "it after adding dendrites (fully_shard cannot be applied twice, and new dendrite "
            "parameters would be neither sharded nor synchronized). Shard the perforated, "
            "unsharded model with perfora.parallel.shard_fsdp2(model, mesh=..., "
            "**fully_shard_kwargs) instead of fully_shard/FullyShardedDataParallel")
    return None


def _is_sharded(model: nn.Module) -> bool:
    """True when FSDP (fully_shard or FullyShardedDataParallel) wraps any part of the model."""
    kinds = fsdp_classes()
    return bool(kinds) and any(isinstance(m, kinds) for m in model.modules())
