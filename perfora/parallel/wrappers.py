"""DDP/DataParallel wrapper specs: how to build such a wrapper again, with the same arguments.

DDP fixes the set of parameters it synchronizes when it is built: a dendrite added later,
or a parameter unfrozen later, is never all-reduced (silent divergence). So after every
change of what trains, perfora builds a new wrapper of the same kind around the same
module, with the same arguments. The DDP constructor also broadcasts rank 0's parameters
and buffers, so every rank starts the new phase from identical values.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..errors import OrderError
from .sharded_state import _SPEC_ATTR

DDP_KIND, DP_KIND = "ddp", "dp"


@dataclass
class WrapperSpec:
    """How to build a data-parallel wrapper again: its kind, arguments and comm hooks."""

    kind: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    comm_hooks: list[tuple[Callable, Any]] = field(default_factory=list)

    def wrap(self, module: nn.Module) -> nn.Module:
        """A new wrapper of this kind around ``module`` (a collective for DDP)."""
        if self.kind == DDP_KIND:
            wrapper: nn.Module = DistributedDataParallel(module, **self.kwargs)
            for hook, state in self.comm_hooks:
                wrapper.register_comm_hook(state, hook)
        elif self.kind == DP_KIND:
            wrapper = nn.DataParallel(module, **self.kwargs)
        else:
            raise OrderError(f"unknown wrapper kind {self.kind!r}")
        wrapper.training = module.training  # a new wrapper starts in train mode: keep eval
        object.__setattr__(wrapper, _SPEC_ATTR, self)
        return wrapper


def _accepted(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Only the arguments this torch version's DDP accepts."""
    names = inspect.signature(DistributedDataParallel.__init__).parameters
    return {k: v for k, v in kwargs.items() if k in names}


def wrap_ddp(module: nn.Module, *, comm_hook: Callable | None = None, comm_state: Any = None,
             **ddp_kwargs: Any) -> DistributedDataParallel:
    """``DistributedDataParallel(module, **ddp_kwargs)`` that perfora rebuilds identically.

    Use it instead of ``DistributedDataParallel(...)`` when you pass arguments perfora cannot
    read back from a built DDP object reliably (e.g. ``bucket_cap_mb_list``,
    ``delay_all_reduce_named_params``); ``comm_hook``/``comm_state`` are registered on
    every wrapper perfora builds. ``init_sync=False`` is refused: the re-wrap relies on
    DDP's broadcast of rank 0's parameters.
    """
    if ddp_kwargs.get("init_sync") is False:
        raise OrderError("wrap_ddp(init_sync=False): perfora relies on DDP broadcasting rank "
                         "0's parameters when it re-wraps the model after adding dendrites; "
                         "drop init_sync")
    hooks = [(comm_hook, comm_state)] if comm_hook is not None else []
    spec = WrapperSpec(DDP_KIND, dict(ddp_kwargs), hooks)
    return spec.wrap(module)  # type: ignore[return-value]


def ddp_kwargs_of(ddp: DistributedDataParallel) -> dict[str, Any]:
    """The constructor arguments of a DDP object built by the user, as far as it keeps them."""
    kw: dict[str, Any] = {
        "device_ids": ddp.device_ids,
        "output_device": ddp.output_device,
        "dim": ddp.dim,
        "find_unused_parameters": ddp.find_unused_parameters,
        "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
        "static_graph": bool(getattr(ddp, "static_graph", False)),
        "mixed_precision": getattr(ddp, "mixed_precision", None),
        "skip_all_reduce_unused_params": getattr(ddp, "skip_all_reduce_unused_params", False),
        "batched_grad_copy": getattr(ddp, "batched_grad_copy", False),
    }
    if getattr(ddp, "device_mesh", None) is not None:
        kw["device_mesh"] = ddp.device_mesh
    else:
        kw["process_group"] = ddp.process_group
    if hasattr(ddp, "forward_sync_buffers"):
        kw["forward_sync_buffers"] = ddp.forward_sync_buffers
    elif hasattr(ddp, "broadcast_buffers"):
        kw["broadcast_buffers"] = ddp.broadcast_buffers
    if not getattr(ddp, "bucket_bytes_cap_default", True):
        caps = list(getattr(ddp, "bucket_bytes_cap_list", []) or [])
        if caps:
            kw["bucket_cap_mb_list"] = [c / 2**20 for c in caps]
        else:
            kw["bucket_cap_mb"] = ddp.bucket_bytes_cap / 2**20
    return _accepted(kw)
