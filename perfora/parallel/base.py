"""The interface every parallel backend implements, and the parts replicated/sharded ones share.

The growth controller asks its backend, never the wrapper's kind: how to read the full
state, how to re-wrap or re-shard after a restructure, how to save and restore the
optimizer state, how many parameters the deployed model has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
from torch import nn

from ..checkpoint.format import to_storable
from ..checkpoint.model_state import load_state_into, shadow_copy
from ..checkpoint.optimizer_state import split_optimizer_state, split_state_dict
from ..distributed.fingerprint import check_same_structure
from ..errors import ParallelError
from ..nn.layers import DendriticLayer, dendritic_layers, unwrap_model
from ..nn.perforation import rebuild_structure
from .sharded_state import ShardSpec, full_state_dict, gather_optimizer_state, shard_optimizer_state

OptimizerState = tuple[dict[str, torch.Tensor], dict]
LayerEdit = Callable[[int, str, DendriticLayer], None]
Prepare = Callable[[nn.Module], None]


class ParallelBackend(Protocol):
    """What the controller needs from the way a model is spread over devices or ranks."""

    name: str
    sharded: bool  # the state is split over ranks: gathered collectively, no weightless copies
    replaces_wrappers: bool  # a re-wrap retires the old wrapper (its buckets miss new params)

    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Every tensor of the model, unsharded (a collective when sharded)."""

    def parameter_count(self, model: nn.Module) -> int:
        """Parameters of the model as deployed (the full copy, not this rank's slice)."""

    def unshard(self, model: nn.Module) -> nn.Module:
        """A module that can be restructured in place (the model itself unless sharded)."""

    def rewrap(self, model: nn.Module) -> nn.Module:
        """Check every rank has the same structure, then wrap or shard the model again."""

    def shadow(self, model: nn.Module) -> nn.Module | None:
        """A weightless copy to rehearse loads on; None where the model cannot be copied."""

    def check_rule(self, rule: str) -> None:
        """Refuse a learning rule this backend cannot run (ParallelError)."""

    def check_config(self, config: Any) -> None:
        """Refuse settings this backend cannot run (ParallelError)."""

    def check_load(self) -> None:
        """Refuse a checkpoint load into the model (ParallelError naming what to do)."""

    def edit_layers(self, model: nn.Module, edit: LayerEdit) -> nn.Module:
        """Apply ``edit(index, path, layer)`` to every dendritic layer (sorted by path);
        returns the model to re-wrap (a collective when sharded)."""

    def snapshot(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's tensors kept for a later rewind (this rank's shards when sharded)."""

    def whole(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A snapshot's tensors whole, to write to a file (a collective when sharded)."""

    def restore(self, model: nn.Module, structure: Mapping[str, Mapping],
                tensors: Mapping[str, torch.Tensor], prepare: Prepare) -> nn.Module:
        """The model with ``structure`` and ``tensors`` (a snapshot, or whole tensors);
        ``prepare(module)`` sets what trains before it is wrapped again."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module
                        ) -> OptimizerState | None:
        """(tensors, JSON) of the optimizer state to save; None when it cannot be saved."""

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module,
                             saved: dict[str, Any], meta: dict[str, Any]) -> None:
        """Restore a saved (joined) optimizer state into ``optimizer``."""


def optimizer_is_current(optimizer: torch.optim.Optimizer, model: nn.Module) -> bool:
    """False when the optimizer holds parameters the model no longer has (after a rewind)."""
    own = {id(p) for p in unwrap_model(model).parameters()}
    return all(id(p) in own for group in optimizer.param_groups for p in group["params"])


class ReplicatedBackend:
    """Every rank holds the whole model: no wrapper, DataParallel and DDP."""

    name = "none"
    sharded = False
    replaces_wrappers = False

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
        """``optimizer.load_state_dict``: indices match the rebuilt optimizer."""
        optimizer.load_state_dict(saved)


class ShardedBackend:
    """FSDP1/FSDP2 through perfora: unshard into a template copy, restructure, shard again."""

    name = "sharded"
    sharded = True
    replaces_wrappers = False

    def __init__(self, spec: ShardSpec) -> None:
        self.spec = spec

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
        return self.spec.wrap(unwrap_model(model))

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


def edit_in_place(model: nn.Module, edit: LayerEdit) -> nn.Module:
    """``edit(index, path, layer)`` on each dendritic layer of ``model``, sorted by path."""
    for index, (path, layer) in enumerate(sorted(dendritic_layers(model).items())):
        edit(index, path, layer)
    return model


def restore_in_place(model: nn.Module, structure: Mapping[str, Mapping],
                     tensors: Mapping[str, torch.Tensor], prepare: Prepare) -> nn.Module:
    """Give ``model`` the saved structure and tensors, then set what trains."""
    rebuild_structure(model, structure)
    load_state_into(model, tensors, "the best-model snapshot")
    prepare(model)
    return model

