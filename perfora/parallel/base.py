"""The interface every parallel backend implements, and the steps several backends share.

The growth controller asks its backend, never the wrapper's kind: how to read the full
state, how to re-wrap or re-shard after a restructure, how to save and restore the
optimizer state, how many parameters the deployed model has, and what the backend can do
(its capabilities, declared on :class:`ParallelBackend` with their defaults).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import torch
from torch import nn

from ..checkpoint.model_state import load_state_into
from ..nn.layers import DendriticLayer, dendritic_layers, unwrap_model
from ..nn.perforation import rebuild_structure

OptimizerState = tuple[dict[str, torch.Tensor], dict]
LayerEdit = Callable[[int, str, DendriticLayer], None]
Prepare = Callable[[nn.Module], None]
PairScope = Callable[[Any], AbstractContextManager[nn.Module]]
"""Given one layer's widening plan entry, a context holding the model in which that layer
and its readers are whole and may be widened (the model itself, unless it is sharded)."""
T = TypeVar("T")


class ParallelBackend(ABC):
    """What the controller needs from the way a model is spread over devices or ranks.

    The capabilities the controller reads are declared here with their defaults (a whole
    model on every rank, perfora building the optimizer); each backend overrides what
    differs. The operations are abstract: every backend says how it does them.
    """

    name: str  # the kind, as run.json and checkpoints record it

    @property
    def sharded(self) -> bool:
        """The state is split over ranks: gathered collectively, no weightless copies."""
        return False

    @property
    def capture_is_collective(self) -> bool:
        """Reading the state for a checkpoint file is a collective (every rank captures,
        rank 0 writes): a sharded state, or an optimizer state read across ranks."""
        return self.sharded

    @property
    def replaces_wrappers(self) -> bool:
        """A re-wrap retires the old wrapper (its buckets miss new parameters)."""
        return False

    @property
    def flat_shards(self) -> bool:
        """Each rank holds flat slices that hide the parameters' shapes (FSDP1): no
        per-row signal, and the optimizer's moments go through a widening whole (gathered by
        parameter name through :meth:`optimizer_state`)."""
        return False

    @property
    def owns_optimizer(self) -> bool:
        """The wrapper builds the optimizer (a DeepSpeed engine): perfora is handed it."""
        return False

    @property
    def auto_dcp(self) -> bool:
        """``checkpoint_format='auto'`` writes DCP folders on more than one rank."""
        return self.sharded

    @property
    def template(self) -> nn.Module | None:
        """The unsharded copy kept for re-sharding (structure only or whole); None
        where no copy is kept."""
        return None

    def engine_optimizer(self, model: nn.Module) -> torch.optim.Optimizer | None:
        """The optimizer the wrapper built (read when ``owns_optimizer``); None here."""
        return None

    def engine_scheduler(self, model: nn.Module) -> Any:
        """The LR scheduler the wrapper built and steps (read when ``owns_optimizer``);
        None here."""
        return None

    def engine_moments(self, model: nn.Module
                       ) -> tuple[dict[str, dict[str, Any]], dict[str, torch.Size]] | None:
        """The wrapper's optimizer state whole by parameter name, and each parameter's
        shape, before a neuron step (read when ``owns_optimizer``); None here."""
        return None

    def load_engine_moments(self, model: nn.Module, states: dict[str, dict[str, Any]]
                            ) -> bool:
        """Give the wrapper's new optimizer ``states`` (grown to the widened shapes) after a
        neuron step; False where it cannot take them (here)."""
        return False

    def whole_shapes(self, model: nn.Module) -> dict[str, torch.Size]:
        """Each parameter's whole shape, by name."""
        return {name: p.shape for name, p in unwrap_model(model).named_parameters()}

    @abstractmethod
    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Every tensor of the model, unsharded (a collective when sharded)."""

    @abstractmethod
    def parameter_count(self, model: nn.Module) -> int:
        """Parameters of the model as deployed (the full copy, not this rank's slice)."""

    @abstractmethod
    def unshard(self, model: nn.Module) -> nn.Module:
        """A module that can be restructured in place (the model itself unless sharded)."""

    @abstractmethod
    def rewrap(self, model: nn.Module) -> nn.Module:
        """Check every rank has the same structure, then wrap or shard the model again."""

    @abstractmethod
    def shadow(self, model: nn.Module) -> nn.Module | None:
        """A weightless copy to rehearse loads on; None where the model cannot be copied."""

    @abstractmethod
    def check_rule(self, rule: str) -> None:
        """Refuse a learning rule this backend cannot run (ParallelError)."""

    @abstractmethod
    def check_config(self, config: Any) -> None:
        """Refuse settings this backend cannot run (ParallelError)."""

    @abstractmethod
    def check_load(self) -> None:
        """Refuse a checkpoint load into the model (ParallelError naming what to do)."""

    @abstractmethod
    def edit_layers(self, model: nn.Module, edit: LayerEdit) -> nn.Module:
        """Apply ``edit(index, path, layer)`` to every dendritic layer (sorted by path);
        returns the model to re-wrap (a collective when sharded)."""

    def widen(self, model: nn.Module, grow: Callable[[nn.Module, PairScope], T]
              ) -> tuple[nn.Module, T]:
        """Run a neuron step ``grow(structure, scope)``: widen each layer pair inside
        ``scope(entry)``; returns the model to re-wrap and what ``grow`` returned. Here the
        unsharded model is both the structure and every pair's scope."""
        inner = self.unshard(model)
        whole = unwrap_model(inner)
        return inner, grow(inner, lambda entry: contextlib.nullcontext(whole))

    @abstractmethod
    def snapshot(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's tensors kept for a later rewind (this rank's shards when sharded)."""

    @abstractmethod
    def whole(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A snapshot's tensors whole, to write to a file (a collective when sharded)."""

    @abstractmethod
    def restore(self, model: nn.Module, structure: Mapping[str, Mapping],
                tensors: Mapping[str, torch.Tensor], prepare: Prepare) -> nn.Module:
        """The model with ``structure`` and ``tensors`` (a snapshot, or whole tensors);
        ``prepare(module)`` sets what trains before it is wrapped again."""

    @abstractmethod
    def optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module
                        ) -> OptimizerState | None:
        """(tensors, JSON) of the optimizer state to save; None when it cannot be saved."""

    @abstractmethod
    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module,
                             saved: dict[str, Any], meta: dict[str, Any]) -> None:
        """Restore a saved (joined) optimizer state into ``optimizer``."""


def optimizer_is_current(optimizer: torch.optim.Optimizer, model: nn.Module) -> bool:
    """False when the optimizer holds parameters the model no longer has (after a rewind)."""
    own = {id(p) for p in unwrap_model(model).parameters()}
    return all(id(p) in own for group in optimizer.param_groups for p in group["params"])


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

