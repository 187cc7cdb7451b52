"""A run as a DCP checkpoint folder: sharded tensors plus perfora's JSON
(:mod:`perfora.checkpoint.dcp` does the folder IO).

Saving reads the model's and optimizer's state by parameter name (sharded: each rank keeps
its own shards, nothing is gathered) and writes them with DCP; the structure, controller,
rule and config go beside them in ``perfora.json`` (the same JSON a ``.safetensors``
checkpoint holds in its header). Loading fits the saved structure onto the model first,
re-shards or re-wraps it, then lets DCP cut the saved tensors to this run's shards, so a
run saved on N ranks resumes on any number of ranks (or in one process without a group).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint.dcp import (
    DCP_SUFFIX,
    Shapes,
    check_optimizer_meta,
    copy_dcp,
    get_state,
    join_optimizer,
    load_dcp,
    read_dcp,
    readable_path,
    save_dcp,
    set_state,
    split_optimizer,
)
from ..checkpoint.model_state import shadow_copy
from ..checkpoint.schema import validate_meta
from ..config import PerforaConfig
from ..distributed.collectives import world_size
from ..errors import CheckpointError, ConfigError, ShapeMismatchError
from ..nn.layers import unwrap_model
from ..nn.perforation import fit_structure
from ..parallel.base import ParallelBackend, optimizer_is_current
from ..parallel.sharded_state import _FSDP1_PREFIX
from .optim import OptimizerRecipe, SchedulerRecipe
from .rehearsal import rehearse_rule
from .saved_run import Captured, Checkpointer, RunParts, SavedRun, check_run_state
from .state import BestSnapshot

OPTIMIZER_GROUP = "optim"


@dataclass(frozen=True)
class Shards:
    """Where the tensors of a DCP folder that was read are: its path, each saved tensor's
    shape and dtype, and DCP's metadata."""

    path: Path
    shapes: Shapes
    metadata: Any


class DcpCheckpointer(Checkpointer):
    """Writes and reads a run as a DCP folder (a collective: every rank calls it)."""

    format = "dcp"
    suffix = DCP_SUFFIX
    collective = True

    def capture(self, parts: RunParts) -> Captured:
        """This rank's shards of the model and optimizer state, and the best snapshot as it
        is kept (FSDP2: shards). Refused where the backend's state cannot go through DCP."""
        _check_backend(parts.backend, parts.config)
        optimizer = parts.slot.optimizer if _saves_optimizer(parts) else None
        model_sd, optim_sd = get_state(_state_module(parts.model, parts.backend), optimizer)
        return Captured(model=model_sd,
                        optimizer=None if optimizer is None else split_optimizer(optim_sd),
                        best=None if parts.best is None else dict(parts.best.tensors),
                        meta={"world_size": world_size(), "parallel": parts.backend.name})

    def write(self, run: SavedRun, paths: Sequence[Path]) -> None:
        """The folder is written at the last path; the others are hard links to its files."""
        *copies, main = paths
        save_dcp(main, run.tensors(OPTIMIZER_GROUP), run.meta())
        for path in copies:
            copy_dcp(main, path)

    def read(self, path: str | os.PathLike) -> SavedRun:
        """The folder's checked state; its tensors are loaded by :meth:`load_rest`."""
        path = readable_path(path)
        meta, shapes, metadata = read_dcp(path)
        source = str(path)
        for key in ("controller", "config", "structure"):
            if key not in meta:
                raise CheckpointError(f"{source}: {key}: missing (not a controller checkpoint)")
        optimizer = meta.pop("optimizer", None)
        try:
            validate_meta(meta, {k: {n: s for n, (s, _) in v.items()}
                                 for k, v in shapes.items()}, check_run_state)
            if optimizer is not None:
                check_optimizer_meta(optimizer, shapes.get(OPTIMIZER_GROUP, {}))
            elif OPTIMIZER_GROUP in shapes:
                raise CheckpointError("optimizer: missing, but the folder holds optimizer "
                                      "tensors")
            PerforaConfig.from_dict(meta["config"])
        except ConfigError as exc:
            raise CheckpointError(f"{source}: config: {exc}") from exc
        except CheckpointError as exc:
            raise CheckpointError(f"{source}: {exc}") from None
        if optimizer is not None:
            meta["optimizer"] = optimizer
        run = SavedRun.from_meta(meta, {}, source=source, folder=path.parent)
        run.pending = Shards(path, shapes, metadata)
        run.state()  # checked
        return run

    def prepare_model(self, model: nn.Module, backend: ParallelBackend, run: SavedRun,
                      config: PerforaConfig, optimizer: OptimizerRecipe | None,
                      scheduler: SchedulerRecipe | None) -> bool:
        if backend.sharded:
            return False  # fitted when the controller unshards it
        checked = False
        shadow = backend.shadow(model)
        if shadow is not None:
            _check_fits(shadow, run, config)
            checked = True
        fit_structure(model, run.structure, run.source)
        return checked

    def check(self, parts: RunParts, run: SavedRun, rehearsed: bool) -> None:
        _check_backend(parts.backend, parts.config)
        run.state()
        _check_optimizer_class(parts, run)
        shadow = None if rehearsed else _weightless(parts.model, parts.backend)
        if shadow is not None:
            _check_fits(shadow, run, parts.config)

    def load_structure(self, model: nn.Module, run: SavedRun) -> None:
        fit_structure(model, run.structure, run.source)

    def load_rest(self, parts: RunParts, run: SavedRun) -> BestSnapshot | None:
        """The saved shards into the model (and optimizer); the best snapshot, read whole."""
        shards: Shards = run.pending
        opt = parts.slot.optimizer
        restore_opt = opt is not None and run.optimizer is not None and not parts.slot.user_owned
        module = _state_module(parts.model, parts.backend)
        # (a fresh optimizer gets its state entries from one zero step at lr 0; loaded over)
        model_sd, optim_sd = get_state(module, opt if restore_opt else None)
        target: dict[str, Any] = {"model": model_sd}
        if restore_opt:
            tensors, _ = split_optimizer(optim_sd)
            saved = _saved_part(tensors, set(shards.shapes.get(OPTIMIZER_GROUP, {})),
                                run.source)
            stateless = frozenset(tensors) - frozenset(saved)
            target[OPTIMIZER_GROUP] = saved
        if "best" in shards.shapes:
            target["best"] = {k: torch.empty(s, dtype=d)
                              for k, (s, d) in shards.shapes["best"].items()}
        load_dcp(shards.path, target, shards.metadata)
        set_state(module, opt if restore_opt else None, target["model"],
                  join_optimizer(target[OPTIMIZER_GROUP], run.optimizer) if restore_opt
                  else None, run.source, strict_optimizer=not (restore_opt and stateless))
        if restore_opt and stateless:  # as saved: no state yet (a fresh optimizer's)
            for name, param in module.named_parameters():
                if name.replace(_FSDP1_PREFIX, "") in stateless:
                    opt.state.pop(param, None)
        if "best" not in target:
            return None
        run.best_tensors = target["best"]
        return run.best


def _saved_part(tensors: dict[str, dict[str, Any]], saved: set[str], source: Any
                ) -> dict[str, dict[str, Any]]:
    """The optimizer's state entries the checkpoint holds. A parameter with no saved state
    at all (one added by the growth step just before the save, not yet stepped) keeps none;
    anything else that differs means another optimizer: CheckpointError."""
    own = {f"{fqn}.{key}" for fqn, entry in tensors.items() for key in entry}
    with_state = {key.rsplit(".", 1)[0] for key in saved}
    unsaved = {fqn for fqn in tensors if fqn not in with_state}
    differ = saved - own or {key for key in own - saved
                             if key.rsplit(".", 1)[0] not in unsaved}
    if differ:
        raise CheckpointError(f"{source}: the optimizer state does not fit the optimizer "
                              f"registered now (differs in {sorted(differ)[:4]}); register the "
                              "same optimizer class and arguments as the saved run")
    return {fqn: entry for fqn, entry in tensors.items() if fqn not in unsaved}


def _check_backend(backend: ParallelBackend, config: PerforaConfig) -> None:
    """Refuse DCP folders where the backend's state cannot go through DCP (DeepSpeed)."""
    backend.check_config(config.replace(checkpoint_format=DcpCheckpointer.format))


def _saves_optimizer(parts: RunParts) -> bool:
    """Whether the optimizer state goes into the checkpoint: an optimizer that holds state
    for the model's current parameters."""
    opt = parts.slot.optimizer
    return opt is not None and bool(opt.state) and optimizer_is_current(opt, parts.model)


def _state_module(model: nn.Module, backend: ParallelBackend) -> nn.Module:
    """The module DCP's state dicts are read from: the FSDP root when sharded, else the bare
    one."""
    return model if backend.sharded else unwrap_model(model)


def _weightless(model: nn.Module, backend: ParallelBackend) -> nn.Module | None:
    """A weightless copy to check the structure on: the model's, or the FSDP template's."""
    if not backend.sharded:
        return backend.shadow(model)
    template = backend.template
    return shadow_copy(template) if template is not None else None


def _check_fits(shadow: nn.Module, run: SavedRun, config: PerforaConfig) -> None:
    """The saved structure, model tensors and rule state fitted to a weightless copy."""
    source, shapes = run.source, run.pending.shapes
    fit_structure(shadow, run.structure, source)
    own = {k: tuple(v.shape) for k, v in shadow.state_dict().items()}
    saved = {k: s for k, (s, _) in shapes.get("model", {}).items()}
    missing, unexpected = sorted(own.keys() - saved), sorted(saved.keys() - own)
    if missing or unexpected:
        raise ShapeMismatchError(f"{source} does not fit this model: missing {missing[:5]}, "
                                 f"unexpected {unexpected[:5]}. Build the model the same way "
                                 "as the run that saved it (same class and sizes)")
    for key, shape in own.items():
        if saved[key] != shape:
            raise ShapeMismatchError(f"{source}: tensor {key!r} has shape {saved[key]} in "
                                     f"the checkpoint but {shape} in this model; build the "
                                     "model with the same sizes as the run that saved it")
    rehearse_rule(shadow, config, run.rule, source)


def _check_optimizer_class(parts: RunParts, run: SavedRun) -> None:
    """CheckpointError before anything changes when the registered optimizer is of another
    class than the saved state's."""
    recipe, saved = parts.slot.recipe, run.optimizer_class
    if run.optimizer is None or recipe is None or parts.slot.user_owned or saved is None:
        return
    if recipe.cls.__qualname__ != saved:
        raise CheckpointError(f"{run.source}: the optimizer state was saved from {saved}, "
                              f"but {recipe.cls.__qualname__} is registered now; register "
                              "the same optimizer class and arguments as the saved run")


__all__ = ["DcpCheckpointer", "Shards"]
