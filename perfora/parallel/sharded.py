"""The backend FSDP1 and FSDP2 share: unshard into a template copy, restructure, shard again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..checkpoint.format import to_storable
from ..checkpoint.optimizer_state import split_state_dict
from ..distributed.fingerprint import check_same_structure
from ..errors import ParallelError
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
from .sharded_state import ShardSpec, full_state_dict, gather_optimizer_state, shard_optimizer_state


class ShardedBackend(ParallelBackend):
    """FSDP1/FSDP2 through perfora: unshard into a template copy, restructure, shard again."""

    name = "sharded"
    sharded = True

    def __init__(self, spec: ShardSpec) -> None:
        self.spec = spec

    @property
    def template(self) -> nn.Module | None:
        """The unsharded copy the spec keeps for the next re-shard."""
        return self.spec.template

    @property
    def kwargs(self) -> dict[str, Any]:
        """The sharding arguments used again at every re-shard."""
        return self.spec.kwargs

    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state on every rank (a collective)."""
        return full_state_dict(model)  # the FSDP root (FSDP1) or the module itself

    def parameter_count(self, model: nn.Module) -> int:
        """Parameters of the module (FSDP2's DTensors report their full shape)."""
        return sum(p.numel() for p in unwrap_model(model).parameters())

    def unshard(self, model: nn.Module) -> nn.Module:
        """An unsharded copy with the full state (a collective)."""
        return self.spec.unshard(model)

    def rewrap(self, model: nn.Module) -> nn.Module:
        """Shard again after a restructure; a model still sharded is left as it is."""
        if self.spec.sharded(model):
            return model  # still sharded: nothing was resized, nothing to shard again
        check_same_structure(model)
        return self.spec.wrap(unwrap_model(model), again=True)

    def shadow(self, model: nn.Module) -> nn.Module | None:
        """None: a sharded model has no local whole copy to rehearse on."""
        return None

    def edit_layers(self, model: nn.Module, edit: LayerEdit) -> nn.Module:
        """Unshard into a whole copy (every tensor gathered), edit it in place."""
        return edit_in_place(self.unshard(model), edit)

    def snapshot(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state, gathered (a collective)."""
        return to_storable(self.full_state(model))

    def whole(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors as they are: this backend keeps whole snapshots."""
        return dict(tensors)

    def restore(self, model: nn.Module, structure: Mapping[str, Mapping],
                tensors: Mapping[str, torch.Tensor], prepare: Prepare) -> nn.Module:
        """Unshard into a whole copy, rebuild its structure and load the tensors."""
        return restore_in_place(self.unshard(model), structure, tensors, prepare)

    def check_config(self, config: Any) -> None:
        """Every setting runs on a sharded model."""

    def check_load(self) -> None:
        """Checkpoints load into a sharded model (gathered or shard by shard)."""

    def check_rule(self, rule: str) -> None:
        """Only 'gd': other rules change parameters outside a restructure."""
        if rule != "gd":
            raise ParallelError(f"rule={rule!r} is not supported under FSDP2 yet (its "
                                "phase switches change parameters outside a restructure); "
                                "use rule='gd', or train under DDP (perfora.wrap_ddp)")

    def optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module
                        ) -> OptimizerState | None:
        """Full tensors by parameter name (a collective); None when stale."""
        if not optimizer_is_current(optimizer, model):
            return None
        sd, names = gather_optimizer_state(optimizer, unwrap_model(model))
        tensors, meta = split_state_dict(sd)
        return to_storable(tensors), {**meta, "param_names": names}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module,
                             saved: dict[str, Any], meta: dict[str, Any]) -> None:
        """Full tensors by name cut to this rank's shards, then loaded."""
        saved = shard_optimizer_state(saved, meta.get("param_names"), optimizer,
                                      unwrap_model(model))
        optimizer.load_state_dict(saved)
