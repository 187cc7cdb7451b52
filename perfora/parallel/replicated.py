"""The backends where every rank holds the whole model: no wrapper, DataParallel and DDP.

A restructure edits the model in place; a wrapper is then built again around the same
module with the same arguments. DDP fixes the parameters it synchronizes when it is
built: a dendrite added later, or a parameter unfrozen later, is never all-reduced, so
after every change perfora builds a new DDP wrapper, whose constructor broadcasts rank 0's
values: every rank starts the new phase from identical values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..checkpoint.format import to_storable
from ..checkpoint.model_state import shadow_copy
from ..checkpoint.optimizer_state import reindex_by_name, split_optimizer_state
from ..distributed.fingerprint import check_same_structure
from ..nn.layers import unwrap_model
from .base import (
    LayerEdit,
    OptimizerState,
    ParallelBackend,
    Prepare,
    edit_in_place,
    optimizer_is_current,
    restore_in_place,
)
from .sharded_state import optimizer_param_names
from .wrappers import WrapperSpec


class ReplicatedBackend(ParallelBackend):
    """Every rank holds the whole model: no wrapper, DataParallel and DDP."""

    name = "none"

    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The inner module's state_dict."""
        return unwrap_model(model).state_dict()

    def parameter_count(self, model: nn.Module) -> int:
        """Parameters of the inner module."""
        return sum(p.numel() for p in unwrap_model(model).parameters())

    def unshard(self, model: nn.Module) -> nn.Module:
        """The model itself: nothing is sharded."""
        return model

    def rewrap(self, model: nn.Module) -> nn.Module:
        """Check the structure over ranks; the model itself without a wrapper."""
        check_same_structure(model)
        return model

    def shadow(self, model: nn.Module) -> nn.Module | None:
        """A weightless copy of the model."""
        return shadow_copy(model)

    def check_rule(self, rule: str) -> None:
        """Every rule runs on a replicated model."""

    def check_config(self, config: Any) -> None:
        """Every setting runs on a replicated model."""

    def check_load(self) -> None:
        """Checkpoints load into a replicated model."""

    def edit_layers(self, model: nn.Module, edit: LayerEdit) -> nn.Module:
        """Edit each layer in place; the model itself."""
        return edit_in_place(model, edit)

    def snapshot(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """A detached copy of the full state."""
        return to_storable(self.full_state(model))

    def whole(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors as they are: a replicated snapshot is whole."""
        return dict(tensors)

    def restore(self, model: nn.Module, structure: Mapping[str, Mapping],
                tensors: Mapping[str, torch.Tensor], prepare: Prepare) -> nn.Module:
        """Rebuild the structure in place and load the tensors."""
        return restore_in_place(model, structure, tensors, prepare)

    def optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module
                        ) -> OptimizerState | None:
        """The optimizer state; None when stale (after the completion's rewind the optimizer
        holds replaced parameters: its moments fit no tensor of the model)."""
        return split_optimizer_state(optimizer) if optimizer_is_current(optimizer, model) \
            else None

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module,
                             saved: dict[str, Any], meta: dict[str, Any]) -> None:
        """``optimizer.load_state_dict``: indices match the rebuilt optimizer (a state saved
        by parameter name, as FSDP1 and DeepSpeed save it, is put at each name's index)."""
        names = meta.get("param_names")
        if names:
            saved = reindex_by_name(saved, list(names), optimizer_param_names(
                optimizer, unwrap_model(model)), optimizer.param_groups)
        optimizer.load_state_dict(saved)


class NoWrapperBackend(ReplicatedBackend):
    """A bare module: nothing to re-wrap, the structure still checked over ranks."""

    name = "none"


class DataParallelBackend(ReplicatedBackend):
    """DataParallel replicates the module each forward; re-wrapped to keep its arguments."""

    name = "dp"

    def __init__(self, spec: WrapperSpec) -> None:
        self.spec = spec

    @property
    def kwargs(self) -> dict:
        """The wrapper's arguments, used again at every re-wrap."""
        return self.spec.kwargs

    def rewrap(self, model: nn.Module) -> nn.Module:
        """A new DataParallel around the (restructured) inner module."""
        check_same_structure(model)
        return self.spec.wrap(unwrap_model(model))


class DDPBackend(DataParallelBackend):
    """A new DDP wrapper (same arguments and comm hooks) after a restructure; the old one is
    retired, since its gradient buckets do not cover the new parameters."""

    name = "ddp"
    replaces_wrappers = True
