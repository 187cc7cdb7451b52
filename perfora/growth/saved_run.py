"""One saved run, whatever its format: the payload a checkpoint holds, how the controller's
parts become one, and the interface of the formats that write and read it.

The controller builds a :class:`SavedRun` from its :class:`RunParts`; a :class:`Checkpointer`
(a ``.safetensors`` file or a DCP folder, chosen by
:func:`perfora.growth.checkpointer.checkpointer_for`) writes it and reads it back. Both
formats hold the same JSON state (:meth:`SavedRun.meta`), checked field by field on
reading (:func:`check_run_state` adds the controller's and the rule's checks to the file
format's own).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from .._version import __version__
from ..checkpoint import format as file_format
from ..checkpoint.format import Checkpoint
from ..checkpoint.optimizer_state import scheduler_state_or_none
from ..config import PerforaConfig
from ..distributed.collectives import is_rank_zero
from ..errors import CheckpointError, ConfigError
from ..nn.layers import unwrap_model
from ..nn.perforation import layer_specs
from ..parallel.base import ParallelBackend
from ..rules import LearningRule, validate_rule_state
from .optim import OptimizerRecipe, SchedulerRecipe
from .optimizer_slot import OptimizerSlot
from .state import BestSnapshot, ControllerState, validate_controller_state

FRAMEWORK_SOURCE = "the saved perfora state"
"""How messages name a state a framework saved (Lightning, HF Trainer)."""


@dataclass(frozen=True)
class RunParts:
    """The parts of a run a checkpoint is made of, as the controller holds them now."""

    model: nn.Module
    backend: ParallelBackend
    config: PerforaConfig
    state: ControllerState
    rule: LearningRule
    slot: OptimizerSlot
    best: BestSnapshot | None
    history_rows: int | None = None
    """Newest history rows a checkpoint keeps (None: all of them)."""


@dataclass(frozen=True)
class Captured:
    """The live tensors of one save, read the way a format stores them: whole (a file) or this
    rank's shards (DCP). ``optimizer``: (tensors, JSON) or None; ``meta``: what the format
    records about the save (DCP: the world size and the parallel kind)."""

    model: dict[str, Any]
    optimizer: tuple[dict[str, Any], dict[str, Any]] | None
    best: dict[str, Any] | None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class SavedRun:
    """What a checkpoint of either format holds: the structure and tensors of the model, the
    controller's, rule's and optimizer's state, the settings and the best snapshot.

    Read from a DCP folder, the tensors are not in memory yet: ``pending`` holds what the
    reader loads them from once the model has the saved structure."""

    structure: dict[str, Any]
    controller: dict[str, Any]
    rule: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    model: dict[str, Any] = field(default_factory=dict)
    best_structure: dict[str, Any] | None = None
    best_tensors: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    optimizer_tensors: dict[str, Any] = field(default_factory=dict)
    optimizer_class: str | None = None
    scheduler: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Other top-level JSON: ``perfora_version``, DCP's ``world_size`` and ``parallel``."""
    source: str = FRAMEWORK_SOURCE
    folder: Path | None = None
    pending: Any = None

    @property
    def best(self) -> BestSnapshot | None:
        """The best snapshot, when the checkpoint holds one (and its tensors are loaded)."""
        if self.best_tensors is None or self.best_structure is None:
            return None
        return BestSnapshot(dict(self.best_structure), self.best_tensors)

    @property
    def metrics(self) -> Path | None:
        """The metrics.csv next to the checkpoint (None: the run folder's)."""
        return None if self.folder is None else self.folder / "metrics.csv"

    def state(self) -> ControllerState:
        """The controller state, checked (CheckpointError naming the source and the field)."""
        return ControllerState.from_saved(self.controller, self.source)

    def settings(self, config: PerforaConfig | Mapping[str, Any] | None,
                 overrides: Mapping[str, Any]) -> PerforaConfig:
        """The settings a resumed run uses: ``config`` (default: the saved ones) with
        ``overrides`` on top; CheckpointError when the saved settings are missing or bad."""
        if self.config is None:
            raise CheckpointError(f"{self.source} holds no controller state; use "
                                  "perfora.load_model() to load weights only")
        try:
            PerforaConfig.from_dict(self.config)
        except ConfigError as exc:
            raise CheckpointError(f"{self.source}: config: {exc}") from exc
        if config is None:
            return PerforaConfig.from_dict({**self.config, **overrides})
        config = PerforaConfig.coerce(config)
        return config.replace(**overrides) if overrides else config

    def check_direction(self, config: PerforaConfig) -> None:
        """ConfigError when ``config`` reads scores the other way round from the saved run:
        its best score and history would then be judged backwards."""
        saved = (self.config or {}).get("maximize")
        if isinstance(saved, bool) and saved != config.maximize:
            raise ConfigError(
                f"{self.source} was saved by a run with maximize={saved}, but the settings "
                f"in force have maximize={config.maximize}: its best score and history would "
                f"be read the other way round; resume with maximize={saved} (perfora.resume "
                "takes it from the checkpoint when left out), or start a new run")

    def meta(self) -> dict[str, Any]:
        """perfora's JSON state, the same in a file's header and a DCP folder's perfora.json."""
        meta: dict[str, Any] = {"structure": self.structure, "controller": self.controller,
                                "rule": self.rule}
        if self.config is not None:
            meta["config"] = self.config
        meta.update(self.extra)
        if self.best_structure is not None:
            meta["best_structure"] = self.best_structure
        if self.optimizer is not None:
            meta["optimizer"] = self.optimizer
            meta["optimizer_class"] = self.optimizer_class
        if self.scheduler is not None:
            meta["scheduler"] = self.scheduler
        return meta

    def tensors(self, optimizer_group: str) -> dict[str, dict[str, Any]]:
        """The tensors by group: ``model``, ``best`` and the optimizer's (named as the
        format names it)."""
        tensors: dict[str, dict[str, Any]] = {"model": self.model}
        if self.best_tensors is not None:
            tensors["best"] = self.best_tensors
        if self.optimizer is not None:
            tensors[optimizer_group] = self.optimizer_tensors
        return tensors

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], tensors: Mapping[str, Any], *, source: str,
                  folder: Path | None = None, optimizer_group: str = "optimizer"
                  ) -> SavedRun:
        """The run a checkpoint's (checked) JSON state and tensors describe."""
        known = {"structure", "controller", "rule", "config", "best_structure", "optimizer",
                 "optimizer_class", "scheduler", "format", "format_version"}
        return cls(structure=meta["structure"], controller=meta["controller"],
                   rule=meta.get("rule", {}), config=meta.get("config"),
                   model=dict(tensors.get("model", {})),
                   best_structure=meta.get("best_structure"), best_tensors=tensors.get("best"),
                   optimizer=meta.get("optimizer"),
                   optimizer_tensors=dict(tensors.get(optimizer_group, {})),
                   optimizer_class=meta.get("optimizer_class"), scheduler=meta.get("scheduler"),
                   extra={k: v for k, v in meta.items() if k not in known},
                   source=source, folder=folder)


def run_state(state: ControllerState, rule: LearningRule, config: PerforaConfig,
              history_rows: int | None = None) -> dict[str, Any]:
    """Controller + rule state and the settings (JSON-able), as every checkpoint holds them."""
    return {"controller": state.to_dict(history_rows=history_rows),
            "rule": rule.state_dict(), "config": config.to_dict()}


def saved_run(parts: RunParts, captured: Captured, model_from_best: bool = False) -> SavedRun:
    """The run now as one payload: structure and state from ``parts``, tensors ``captured``
    by the format that writes it. ``model_from_best``: the model tensors and structure are
    the best snapshot's (the optimizer state then only if the structure is the same)."""
    state = run_state(parts.state, parts.rule, parts.config, parts.history_rows)
    run = SavedRun(structure=layer_specs(unwrap_model(parts.model)), **state,
                   model=captured.model,
                   extra={"perfora_version": __version__, **captured.meta})
    optimizer, best = captured.optimizer, parts.best
    if model_from_best and best is not None:
        if best.structure != run.structure:
            optimizer = None  # the moments belong to the grown model, not the best one
        run.structure, run.model = best.structure, dict(captured.best or {})
    if best is not None:
        run.best_structure, run.best_tensors = best.structure, captured.best
    if optimizer is not None:
        run.optimizer_tensors, run.optimizer = optimizer
        run.optimizer_class = type(parts.slot.optimizer).__qualname__
    if parts.slot.scheduler is not None:
        run.scheduler = scheduler_state_or_none(parts.slot.scheduler.state_dict(), 5)
    return run


def check_run_state(meta: Mapping[str, Any], structure: Mapping[str, Any] | None) -> None:
    """The controller's and the rule's part of a checkpoint's JSON state, field by field (the
    check :func:`perfora.checkpoint.schema.validate_meta` leaves to this floor)."""
    if "controller" in meta:
        validate_controller_state(meta["controller"])
    if "rule" in meta:
        validate_rule_state(meta["rule"], structure=structure)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint; corrupt, truncated, pickle, foreign or inconsistent files raise
    CheckpointError naming what is wrong.

    The headers are read and checked first (size and nesting caps, every field of perfora's
    state, tensor shapes and byte ranges against the file size); tensor data is read only
    then, one tensor at a time, straight into its tensor."""
    return file_format.load_checkpoint(path, check_run_state)


class Checkpointer(ABC):
    """One checkpoint format: writes a :class:`SavedRun`, reads one back, and does the
    format's steps of the one restore path (``GrowthController`` runs it: :meth:`check`,
    then the structure with :meth:`load_structure`, then :meth:`load_rest` once the model
    and optimizer are rebuilt)."""

    format: str
    """``"file"`` or ``"dcp"``, as the ``checkpoint_format`` setting names them."""
    suffix: str
    """The name ending of its checkpoints in a run folder."""
    collective: bool
    """True when every rank writes its own part (DCP), False when one file is written whole."""

    def save(self, parts: RunParts, path: str | os.PathLike) -> None:
        """Write the run as it is now to ``path`` (distributed: call it on every rank)."""
        run = saved_run(parts, self.capture(parts))
        if self.collective or not parts.backend.sharded or is_rank_zero():
            self.write(run, [Path(path)])

    @abstractmethod
    def capture(self, parts: RunParts) -> Captured:
        """The live tensors a payload of this format holds (a collective when sharded)."""

    @abstractmethod
    def write(self, run: SavedRun, paths: Sequence[Path]) -> None:
        """Write ``run`` under each of ``paths`` (one checkpoint under several names, the last
        the main one), encoded once."""

    @abstractmethod
    def read(self, path: str | os.PathLike) -> SavedRun:
        """The run saved at ``path``, every part of its state checked."""

    @abstractmethod
    def prepare_model(self, model: nn.Module, backend: ParallelBackend, run: SavedRun,
                      config: PerforaConfig, optimizer: OptimizerRecipe | None,
                      scheduler: SchedulerRecipe | None) -> bool:
        """Resuming onto a freshly built ``model``: check the load on a weightless copy where
        one can be made, then give ``model`` the saved structure. True when the load was
        rehearsed (then :meth:`check` skips it)."""

    @abstractmethod
    def check(self, parts: RunParts, run: SavedRun, rehearsed: bool) -> None:
        """Everything that can be checked before the model changes (CheckpointError)."""

    @abstractmethod
    def load_structure(self, model: nn.Module, run: SavedRun) -> None:
        """The saved structure into the (unsharded) model, with the weights where a format
        holds them whole."""

    @abstractmethod
    def load_rest(self, parts: RunParts, run: SavedRun) -> BestSnapshot | None:
        """After the model and optimizer were rebuilt: the tensors still to load (optimizer
        state; DCP: the shards); returns the best snapshot."""
