"""A run as one ``.safetensors`` file: the whole model and optimizer state, and perfora's JSON
state in the header (:mod:`perfora.checkpoint.format` does the file IO).

Sharded models are gathered for it (a collective), rank 0 writes; reading checks every header
field first and rehearses the whole load on a weightless copy of the model before it changes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from ..checkpoint.files import atomic_write_bytes
from ..checkpoint.format import Checkpoint, encode_checkpoint
from ..checkpoint.model_state import load_state_into
from ..checkpoint.optimizer_state import join_optimizer_state
from ..config import PerforaConfig
from ..errors import CheckpointError
from ..nn.perforation import fit_structure
from ..parallel.base import ParallelBackend
from .optim import OptimizerRecipe, SchedulerRecipe
from .rehearsal import rehearse_checkpoint
from .saved_run import Captured, Checkpointer, RunParts, SavedRun, load_checkpoint
from .state import BestSnapshot

FILE_SUFFIX = ".safetensors"
OPTIMIZER_GROUP = "optimizer"


class FileCheckpointer(Checkpointer):
    """Writes and reads a run as one safetensors file (tensors + JSON, never pickle)."""

    format = "file"
    suffix = FILE_SUFFIX
    collective = False

    def capture(self, parts: RunParts) -> Captured:
        """The full model state, the optimizer's (under FSDP2 by parameter name) and the best
        snapshot whole (a collective when sharded); no optimizer state when it is stale."""
        backend, model, optimizer = parts.backend, parts.model, parts.slot.optimizer
        return Captured(
            model=backend.full_state(model),
            optimizer=None if optimizer is None else backend.optimizer_state(optimizer, model),
            best=None if parts.best is None else backend.whole(parts.best.tensors))

    def encode(self, run: SavedRun) -> Checkpoint:
        """The content of the run's file: tensors by group and the JSON state."""
        return Checkpoint(tensors=run.tensors(OPTIMIZER_GROUP), meta=run.meta())

    def write(self, run: SavedRun, paths: Sequence[Path]) -> None:
        data = encode_checkpoint(self.encode(run))
        for path in paths:
            atomic_write_bytes(path, data)

    def read(self, path: str | os.PathLike) -> SavedRun:
        path = Path(path)
        ckpt = load_checkpoint(path)
        meta = ckpt.meta
        if "controller" not in meta:
            raise CheckpointError(f"{path} holds a model but no controller state; use "
                                  "perfora.load_model() for weights only")
        if "structure" not in meta:
            raise CheckpointError(f"{path}: structure: missing")
        return SavedRun.from_meta(meta, ckpt.tensors, source=str(path), folder=path.parent,
                                  optimizer_group=OPTIMIZER_GROUP)

    def prepare_model(self, model: nn.Module, backend: ParallelBackend, run: SavedRun,
                      config: PerforaConfig, optimizer: OptimizerRecipe | None,
                      scheduler: SchedulerRecipe | None) -> bool:
        # rehearsed on a weightless copy first: a file that does not fit raises here, before
        # the model is converted or resized
        shadow = backend.shadow(model) if backend.sharded else None
        if shadow is not None:
            # a sharded model with a weightless copy (a ZeRO-3 engine's template): rehearsed
            # there; the controller's load gives the model its structure (on an unsharded copy)
            rehearse_checkpoint(shadow, run, config, optimizer, scheduler,
                                activation=config.activation)
            return True
        rehearse_checkpoint(model, run, config, optimizer, scheduler,
                            activation=config.activation)
        fit_structure(model, run.structure, run.source)
        return True

    def check(self, parts: RunParts, run: SavedRun, rehearsed: bool) -> None:
        shadow = parts.backend.shadow(parts.model)  # None where sharded without a template
        if not rehearsed and shadow is not None:
            slot = parts.slot
            rehearse_checkpoint(shadow, run, parts.config,
                                slot.recipe if slot.rebuildable else None, slot.scheduler_recipe)

    def load_structure(self, model: nn.Module, run: SavedRun) -> None:
        fit_structure(model, run.structure, run.source)
        load_state_into(model, run.model, run.source)

    def load_rest(self, parts: RunParts, run: SavedRun) -> BestSnapshot | None:
        """The saved optimizer state into the one perfora rebuilt."""
        optimizer, slot = parts.slot.optimizer, parts.slot
        if optimizer is not None and run.optimizer is not None and not slot.user_owned:
            saved = join_optimizer_state(run.optimizer_tensors, run.optimizer)
            try:
                parts.backend.load_optimizer_state(optimizer, parts.model, saved, run.optimizer)
            except (ValueError, KeyError) as exc:
                raise CheckpointError(f"{run.source}: the optimizer state does not fit the "
                                      f"optimizer registered now ({exc}); register the same "
                                      "optimizer class and arguments as the saved run"
                                      ) from exc
        return run.best
