"""A controller to and from a checkpoint: what is saved, and the one path that restores it.

:func:`restore` serves a file load, a resume onto a fresh model (:func:`from_checkpoint`,
which reads the file once) and a framework that restores the weights itself (Lightning,
HF Trainer): everything is checked and rehearsed first, then applied.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._version import __version__
from ..checkpoint.dcp import is_dcp_path
from ..checkpoint.format import Checkpoint, load_checkpoint, save_checkpoint
from ..checkpoint.model_state import load_state_into, rehearse_load
from ..checkpoint.optimizer_state import join_optimizer_state
from ..checkpoint.schema import validate_rule_state, validate_structure
from ..config import PerforaConfig
from ..distributed.collectives import barrier, is_rank_zero
from ..errors import CheckpointError, ConfigError
from ..nn.layers import unwrap_model
from ..nn.perforation import fit_structure, layer_specs
from .dcp_checkpoint import (
    DCP,
    format_of,
    from_dcp_checkpoint,
    newest_checkpoint,
    read_checkpoint,
    restore_dcp,
    save_dcp_checkpoint,
)
from .optim import OptimizerRecipe, SchedulerRecipe
from .rehearsal import checked_state, rehearse_checkpoint, rehearse_rule
from .state import RESTRUCTURE, BestSnapshot, ControllerState, Decision

if TYPE_CHECKING:
    from typing import Self

    from .controller import GrowthController


class CheckpointMethods:
    """The controller's checkpoint methods: state to save, file load, framework restore."""

    def state_dict(self, history_rows: int | None = None) -> dict[str, Any]:
        """Controller + rule state (JSON-able).

        ``history_rows``: keep only the newest rows of the per-epoch history. perfora's own
        checkpoints keep ``history_lookback`` rows, so their JSON does not grow with the
        epochs (metrics.csv holds every row; a resume reads them back from the metrics.csv
        next to the file). The default keeps all rows, for frameworks that store this state
        in their own checkpoints (Lightning, HF Trainer) and may resume into another
        folder, where no metrics.csv of the run is."""
        return {"controller": self.state.to_dict(history_rows=history_rows),
                "rule": self.rule.state_dict(), "config": self.config.to_dict()}

    def to_checkpoint(self, model_from_best: bool = False) -> Checkpoint:
        """Everything needed to resume exactly: model, best snapshot, optimizer, state.

        ``model_from_best``: the model tensors and structure are the best snapshot."""
        inner = unwrap_model(self.model)
        tensors: dict[str, dict[str, torch.Tensor]] = {"model": self._writer.model_state(self)}
        # with a run folder metrics.csv holds every row; without one the checkpoint does
        rows = self.config.history_lookback if self._writer.report is not None else None
        meta: dict[str, Any] = {"structure": layer_specs(inner),
                                **self.state_dict(history_rows=rows),
                                "perfora_version": __version__}
        optimizer = self._writer.optimizer_state(self)
        best, best_tensors = self._best, self._writer.best_state(self)
        if model_from_best and best is not None:
            if best.structure != meta["structure"]:
                optimizer = None  # the moments belong to the grown model, not the best one
            meta["structure"], tensors["model"] = best.structure, best_tensors
        if best is not None:
            tensors["best"] = best_tensors
            meta["best_structure"] = best.structure
        if optimizer is not None:
            opt_tensors, opt_meta = optimizer
            tensors["optimizer"] = opt_tensors
            meta["optimizer"] = opt_meta
            meta["optimizer_class"] = type(self.optimizer).__qualname__
        if self.scheduler is not None:
            meta["scheduler"] = _jsonable_or_none(self.scheduler.state_dict())
        return Checkpoint(tensors=tensors, meta=meta)


    def save(self, path: str | Path) -> None:
        """Write a checkpoint atomically (safetensors + JSON, or a DCP folder; never pickle).

        A ``.dcp`` name writes a DCP folder (every rank its own shards; a collective), a
        ``.safetensors`` name one file, any other name what ``checkpoint_format`` says.
        Distributed, call it on every rank: for a file under FSDP the full model and
        optimizer state is gathered, rank 0 writes."""
        if format_of(path, self.config.checkpoint_format, self.backend) == DCP:
            save_dcp_checkpoint(self, path)
            return
        ckpt = self.to_checkpoint()
        if not self.backend.sharded or is_rank_zero():
            save_checkpoint(path, ckpt)

    def load(self, path_or_name: str | Path) -> Decision:
        """Resume from a checkpoint: structure, weights, controller, rule, optimizer state.

        A bare name (``"latest"``, ``"best"``, ``"switch_3"``) is looked up in ``run_dir``
        (a ``.safetensors`` file or a ``.dcp`` folder; the newer when both are there). A
        DCP folder is read on any number of ranks (call it on every rank), or in one process.
        Register the optimizer (and scheduler) before loading so their state is restored.
        The file is checked and the load rehearsed on a weightless copy of the model first:
        a file that is corrupt or does not fit raises CheckpointError (ShapeMismatchError)
        and leaves the model, controller and optimizer as they were (a DCP folder: its
        files, structure and shapes are checked first; the optimizer state as it loads).
        """
        path = Path(path_or_name)
        if not path.suffix and self.run_dir is not None and not path.exists():
            path = self.find_checkpoint(str(path_or_name))
        barrier()  # rank 0 may still be writing the file the other ranks read
        if is_dcp_path(path):
            restore_dcp(self, *read_checkpoint(path))
        else:
            restore_file(self, load_checkpoint(path), path)
        return self._decision(RESTRUCTURE, f"loaded {path.name}")

    def find_checkpoint(self, name: str) -> Path:
        """Checkpoint ``name`` in run_dir: the newest of its file and DCP folder, or the path
        the format in force writes when neither is there."""
        writer = self._writer
        return newest_checkpoint([self.checkpoint_path(name), writer.checkpoint_path(name),
                                  writer.dcp_path(name)])

    def load_state(self, meta: Mapping[str, Any],
                   best: Mapping[str, torch.Tensor] | None = None) -> None:
        """Restore the controller, rule and best snapshot without touching the weights.

        For frameworks that restore the weights themselves (Lightning): the model must
        already have the saved structure. ``meta`` is :meth:`state_dict` plus
        ``best_structure``; ``best`` the best snapshot's tensors. Everything is checked
        first: a state that is malformed or does not fit raises CheckpointError and leaves
        the controller as it was."""
        if not isinstance(meta, Mapping) or "controller" not in meta:
            raise CheckpointError("the saved perfora state has no controller entry")
        source = "the saved perfora state"
        state = checked_state(meta["controller"], source)
        rule_state, best_structure = meta.get("rule", {}), meta.get("best_structure")
        try:
            validate_rule_state(rule_state, structure=layer_specs(self.model))
            if best_structure is not None:
                best_structure = validate_structure(best_structure, "best_structure")
        except CheckpointError as exc:
            raise CheckpointError(f"{source}: {exc}") from None
        shadow = self.backend.shadow(self.model)
        if shadow is not None:
            rehearse_rule(shadow, self.config, rule_state, source)
            if best is not None and best_structure is not None:
                fit_structure(shadow, best_structure, "the saved best structure")
                rehearse_load(shadow, best, "the saved best snapshot")
        snapshot = None
        if best is not None and best_structure is not None:
            snapshot = BestSnapshot(dict(best_structure), dict(best))
        restore(self, state, meta, source, best=snapshot)


    @classmethod
    def from_checkpoint(cls, path: str | Path, model: nn.Module,
                        config: PerforaConfig | None = None, **kw: Any) -> Self:
        """A controller continuing the run saved in ``path`` on a freshly built ``model``.

        The file is read once; the keywords are :func:`perfora.resume`'s (``optimizer``,
        ``optimizer_args``, ``scheduler``, ``scheduler_args``, ``run_dir``, settings).
        ``config`` replaces the saved settings (default: the checkpoint's)."""
        return from_checkpoint(cls, path, model, config, **kw)


def restore_file(ctl: GrowthController, ckpt: Checkpoint, path: Path,
                 rehearsed: bool = False) -> None:
    """Restore from a loaded (header-checked) checkpoint: structure, weights and state."""
    meta = ckpt.meta
    if "controller" not in meta:
        raise CheckpointError(f"{path} holds a model but no controller state; use "
                              "perfora.load_model() for weights only")
    if "structure" not in meta:
        raise CheckpointError(f"{path}: structure: missing")
    state = checked_state(meta["controller"], str(path))
    restore(ctl, state, meta, str(path), ckpt=ckpt, rehearsed=rehearsed,
            metrics=path.parent / "metrics.csv")


def restore(ctl: GrowthController, state: ControllerState, meta: Mapping[str, Any],
            source: str, *, ckpt: Checkpoint | None = None, best: BestSnapshot | None = None,
            rehearsed: bool = False, metrics: Path | None = None) -> None:
    """The one restore path: with ``ckpt`` (rehearsed first) its structure and weights, then
    the controller and rule state, the best snapshot, and with ``ckpt`` the optimizer's.

    The history before the checkpoint's newest rows is read back from ``metrics`` (the
    metrics.csv next to the file; default the run folder's), and metrics.csv is rewritten
    with the rows up to the checkpoint's epoch."""
    if ckpt is not None:
        if not rehearsed and not ctl.backend.sharded:
            slot = ctl._slot
            rehearse_checkpoint(ctl.model, ckpt, source, ctl.config,
                                slot.recipe if slot.rebuildable else None,
                                slot.scheduler_recipe)
        ctl._unshard()
        fit_structure(ctl.model, meta["structure"], source)
        load_state_into(ctl.model, ckpt.tensors.get("model", {}), source)
    ctl.state = state
    if ckpt is not None:
        ctl.state.num_dendrites = ctl._layer_dendrites()  # "best" may hold fewer than the run
    ctl.rule.load_state_dict(meta.get("rule", {}), ctl._layers())
    if ckpt is not None and "best" in ckpt.tensors:
        best = BestSnapshot(meta["best_structure"], ckpt.tensors["best"])
    ctl._best, ctl._writer.best_unsaved = best, False
    if ckpt is not None:
        ctl._rebuild_after_change()
        _restore_optimizer(ctl, ckpt, source)
    if ctl._writer.report is not None:
        ctl.state.history = ctl._writer.report.resume_history(ctl.state.history,
                                                              ctl.state.epoch, metrics)
    ctl._arm_probe()
    ctl._last_time = time.perf_counter()


def _restore_optimizer(ctl: GrowthController, ckpt: Checkpoint, source: str) -> None:
    """The saved optimizer and scheduler state into the ones perfora rebuilt."""
    meta = ckpt.meta
    if ctl.optimizer is not None and "optimizer" in meta and not ctl._slot.user_owned:
        saved = join_optimizer_state(ckpt.tensors.get("optimizer", {}), meta["optimizer"])
        try:
            ctl.backend.load_optimizer_state(ctl.optimizer, ctl.model, saved, meta["optimizer"])
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"{source}: the optimizer state does not fit the "
                                  f"optimizer registered now ({exc}); register the same "
                                  "optimizer class and arguments as the saved run") from exc
    if ctl.scheduler is not None and meta.get("scheduler") is not None:
        ctl.scheduler.load_state_dict(meta["scheduler"])


def from_checkpoint(cls: type[GrowthController], path: str | Path, model: nn.Module,
                    config: PerforaConfig | None = None, *, optimizer: type | None = None,
                    optimizer_args: dict[str, Any] | None = None,
                    scheduler: type | None = None,
                    scheduler_args: dict[str, Any] | None = None,
                    run_dir: str | Path | None = None, **settings: Any) -> GrowthController:
    """A controller of class ``cls`` continuing the run saved in ``path`` (read once)."""
    from ..parallel import backend_of

    backend_of(model).check_load()  # a ZeRO-3 engine refuses, naming the workaround
    path = Path(path)
    if is_dcp_path(path):
        return from_dcp_checkpoint(cls, path, model, config, settings, optimizer=optimizer,
                                   optimizer_args=optimizer_args, scheduler=scheduler,
                                   scheduler_args=scheduler_args, run_dir=run_dir)
    ckpt = load_checkpoint(path)
    meta = ckpt.meta
    if "controller" not in meta or "config" not in meta:
        raise CheckpointError(f"{path} holds no controller state; use perfora.load_model() "
                              "to load weights only")
    if "structure" not in meta:
        raise CheckpointError(f"{path}: structure: missing")
    try:
        PerforaConfig.from_dict(meta["config"])
    except ConfigError as exc:
        raise CheckpointError(f"{path}: config: {exc}") from exc
    if config is None:
        config = PerforaConfig.from_dict({**meta["config"], **settings})
    elif settings:
        config = config.replace(**settings)
    opt_recipe = OptimizerRecipe(optimizer, dict(optimizer_args or {})) if optimizer else None
    sched_recipe = SchedulerRecipe(scheduler, dict(scheduler_args or {})) if scheduler else None
    # rehearsed on a weightless copy first: a file that does not fit raises here, before
    # the model is converted or resized
    rehearse_checkpoint(model, ckpt, str(path), config, opt_recipe, sched_recipe,
                        activation=config.activation)
    fit_structure(model, meta["structure"], str(path))
    ctl = cls(model, config, run_dir=run_dir if run_dir is not None else path.parent)
    if optimizer is not None:
        ctl.set_optimizer(optimizer, **(optimizer_args or {}))
    if scheduler is not None:
        ctl.set_scheduler(scheduler, **(scheduler_args or {}))
    restore_file(ctl, ckpt, path, rehearsed=True)
    return ctl


def _jsonable_or_none(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The scheduler state if JSON can hold it; None (warned: it restarts) otherwise."""
    try:
        json.dumps(state)
        return dict(state)
    except TypeError:
        warnings.warn("the scheduler's state is not JSON-serializable and was not saved; "
                      "it restarts from its initial state on resume", stacklevel=3)
        return None
