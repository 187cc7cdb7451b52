"""FSDP1 (``FullyShardedDataParallel``): a spec perfora can wrap again, and its backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..checkpoint.format import to_storable
from ..checkpoint.optimizer_state import split_state_dict
from ..errors import ParallelError
from ..nn.layers import dendritic_layers, unwrap_model
from .base import OptimizerState, optimizer_is_current
from .fsdp1_optim import full_optimizer_state, load_full_optimizer_state
from .sharded import ShardedBackend
from .sharded_state import FSDP1_KIND, ShardSpec, is_fsdp1, is_fsdp2


@dataclass
class FSDP1Spec(ShardSpec):
    """How to wrap again: one FSDP unit with ``use_orig_params=True`` and the kept arguments."""

    kind = FSDP1_KIND

    def sharded(self, model: nn.Module) -> bool:
        """True when ``model`` is a FullyShardedDataParallel root."""
        return is_fsdp1(model)

    def _place(self, module: nn.Module) -> None:
        """Move the module to ``device_id`` first: the broadcast runs on that device."""
        device = self.kwargs.get("device_id")
        if device is not None:
            module.to(torch.device("cuda", device) if isinstance(device, int) else device)

    def _shard(self, module: nn.Module) -> nn.Module:
        """The module wrapped in one FullyShardedDataParallel unit."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(module, use_orig_params=True, **self.kwargs)


class FSDP1Backend(ShardedBackend):
    """FSDP1: flat slices per parameter; the optimizer state is saved and loaded whole, by
    parameter name, through torch's full optimizer state dict."""

    name = FSDP1_KIND
    flat_shards = True

    def parameter_count(self, model: nn.Module) -> int:
        """The template's parameters: each rank's parameters hold only its slice."""
        template = self.spec.template
        if template is not None:
            return sum(p.numel() for p in template.parameters())
        return sum(p.numel() for p in unwrap_model(model).parameters())

    def optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module
                        ) -> OptimizerState | None:
        """Whole tensors by parameter name (a collective); None when stale."""
        if not optimizer_is_current(optimizer, model):
            return None
        sd, names = full_optimizer_state(optimizer, model)
        tensors, meta = split_state_dict(sd)
        return to_storable(tensors), {**meta, "param_names": names}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module,
                             saved: dict[str, Any], meta: dict[str, Any]) -> None:
        """Whole tensors by name, cut to this rank's slices and loaded (a collective)."""
        names = meta.get("param_names")
        if not names:
            raise ValueError("the saved optimizer state has no parameter names")
        load_full_optimizer_state(optimizer, model, saved, list(names))


def wrap_fsdp1(model: nn.Module, **fsdp_kwargs: Any) -> nn.Module:
    """``FullyShardedDataParallel`` (FSDP1) around a perforated model, re-wrappable by perfora.

    The model is one FSDP unit with ``use_orig_params=True`` (perfora resizes the original
    parameters); ``fsdp_kwargs`` (``device_id=``, ``sharding_strategy=``,
    ``mixed_precision=``, ...) are kept and used again at every restructure. Prefer FSDP2
    (:func:`perfora.parallel.fsdp2.shard_fsdp2`); this is for code and strategies built on
    FSDP1. A model it already wrapped with the same arguments comes back as it is (Lightning's
    ``configure_model`` runs again at every stage).
    """
    spec = FSDP1Spec(dict(fsdp_kwargs))
    if spec.same_as_held_by(model, "wrap_fsdp1"):
        return model  # configure_model again (Lightning's test/validate/predict after fit)
    if is_fsdp1(model) or is_fsdp2(model):
        raise ParallelError("wrap_fsdp1 got a model that is already sharded; give it the "
                            "unsharded, perforated model")
    if not dendritic_layers(model):
        raise ParallelError("wrap_fsdp1 needs a perforated model: call "
                            "perfora.perforate(model) first")
    for name in ("auto_wrap_policy", "use_orig_params"):
        if name in fsdp_kwargs:
            raise ParallelError(f"wrap_fsdp1 does not take {name}=: perfora wraps the model "
                                "as one FSDP unit with use_orig_params=True so that it can "
                                "resize the dendrite parameters")
    return spec.wrap(model)
