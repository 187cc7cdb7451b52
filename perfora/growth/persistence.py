"""The controller's checkpoint methods: save, load, resume onto a fresh model, and the state
frameworks keep in their own checkpoints.

Each goes through one checkpointer (a ``.safetensors`` file or a DCP folder, chosen by
:func:`perfora.growth.checkpointer.checkpointer_for`) and the controller's one restore path;
the controller provides the parts a checkpoint is made of and that path (the two hooks
below), this module nothing of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Self

import torch
from torch import nn

from ..checkpoint.call_args import model_and_path
from ..checkpoint.dcp import DCP_SUFFIX, newest_checkpoint
from ..checkpoint.format import Checkpoint
from ..checkpoint.schema import with_keys_of
from ..config import PerforaConfig
from ..distributed.collectives import barrier
from ..parallel import ParallelBackend, backend_of
from ..rules import LearningRule
from ..warn import warn_user
from .checkpointer import checkpointer_for
from .file_checkpointer import FILE_SUFFIX, FileCheckpointer
from .optim import OptimizerRecipe, SchedulerRecipe
from .optimizer_slot import OptimizerSlot
from .rehearsal import framework_state
from .saved_run import Checkpointer, RunParts, SavedRun, run_state, saved_run
from .state import RESTRUCTURE, ControllerState, Decision


class CheckpointMethods:
    """The controller's checkpoint methods: state to save, file load, framework restore.

    The controller provides the hooks below: the parts a checkpoint is made of, now; the
    one restore path; its decisions."""

    model: nn.Module
    backend: ParallelBackend
    config: PerforaConfig
    state: ControllerState
    rule: LearningRule
    run_dir: Path | None
    checkpoint_path: Callable[[str], Path]
    _slot: OptimizerSlot
    scheduler: Any
    # a load before any optimizer is registered warns that its saved state was not restored
    # (the PerforatedAI recipe loads first by design: its controller sets this False)
    warns_unrestored_optimizer: bool = True
    # a load with another ``maximize`` than the saved run's is refused; the PerforatedAI
    # recipe's load_system restores the tracker, direction included: its controller adopts it
    adopts_saved_direction: bool = False
    # how a message tells the user to resume this run (the PerforatedAI names for its recipe)
    resume_hint: str = "controller.load('latest')"

    def _parts(self) -> RunParts:
        raise NotImplementedError

    def _restore(self, run: SavedRun, reader: Checkpointer | None = None,
                 rehearsed: bool = False) -> None:
        raise NotImplementedError

    def _decision(self, action: str, reason: str) -> Decision:
        raise NotImplementedError

    def state_dict(self, history_rows: int | None = None) -> dict[str, Any]:
        """Controller + rule state (JSON-able).

        ``history_rows``: keep only the newest rows of the per-epoch history. perfora's own
        checkpoints keep ``history_lookback`` rows, so their JSON does not grow with the
        epochs (metrics.csv holds every row; a resume reads them back from the metrics.csv
        next to the file). The default keeps all rows, for frameworks that store this state
        in their own checkpoints (Lightning, HF Trainer) and may resume into another
        folder, where no metrics.csv of the run is."""
        return run_state(self.state, self.rule, self.config, history_rows)

    def to_checkpoint(self, model_from_best: bool = False) -> Checkpoint:
        """Everything needed to resume exactly, as a ``.safetensors`` file holds it: model,
        best snapshot, optimizer, state.

        ``model_from_best``: the model tensors and structure are the best snapshot."""
        file, parts = FileCheckpointer(), self._parts()
        return file.encode(saved_run(parts, file.capture(parts), model_from_best))

    def save(self, path: str | Path = "latest") -> Path:
        """Write a checkpoint atomically (safetensors + JSON, or a DCP folder; never pickle);
        returns where.

        A bare name (``"latest"``, the default, ``"final"``) is written in ``run_dir``, as
        :meth:`load` looks it up; a ``.dcp`` name writes a DCP folder (every rank its own
        shards; a collective), a ``.safetensors`` name one file, any other path what
        ``checkpoint_format`` says. Distributed, call it on every rank: for a file under FSDP
        the full model and optimizer state is gathered, rank 0 writes."""
        if _bare_name(path):
            path = self.checkpoint_path(str(path))  # OrderError without a run_dir
        checkpointer_for(path, self.config.checkpoint_format, self.backend).save(
            self._parts(), path)
        return Path(path)

    def load(self, path_or_name: str | Path) -> Decision:
        """Resume from a checkpoint: structure, weights, controller, rule, optimizer state.

        A bare name (``"latest"``, ``"best"``, ``"switch_3"``) is looked up in ``run_dir``
        (a ``.safetensors`` file or a ``.dcp`` folder; the newer when both are there). A
        DCP folder is read on any number of ranks (call it on every rank), or in one process.
        The optimizer (and scheduler) state is restored into the ones registered with
        ``set_optimizer`` before the load, or, where none was, into the first that
        ``build_optimizer()`` builds after it (a DCP folder's only into one registered
        before). The controller keeps its own settings (perfora.resume
        takes the checkpoint's); a ``maximize`` other than the saved one raises ConfigError.
        The file is checked and the load rehearsed on a weightless copy of the model first:
        a file that is corrupt or does not fit raises CheckpointError (ShapeMismatchError)
        and leaves the model, controller and optimizer as they were (a DCP folder: its
        files, structure and shapes are checked first; the optimizer state as it loads).
        """
        path = Path(path_or_name)
        if _bare_name(path_or_name) and not path.exists():
            path = self.find_checkpoint(str(path_or_name))  # OrderError without a run_dir
        barrier()  # rank 0 may still be writing the file the other ranks read
        reader = checkpointer_for(path)
        run = reader.read(path)
        self._settle_direction(run)
        self._restore(run, reader)
        self._slot.scheduler_mark = None  # its step count is the checkpoint's now
        if run.optimizer is not None and self.warns_unrestored_optimizer:
            self._keep_unrestored_optimizer(run, reader, path.name)
        self._warn_unrestored_scheduler(run, path.name)
        return self._decision(RESTRUCTURE, f"loaded {path.name}")

    def _warn_unrestored_scheduler(self, run: SavedRun, name: str) -> None:
        """A checkpoint whose run stepped an LR scheduler, loaded where none is registered:
        the learning rate would stay where it was for the rest of the run, silently."""
        if run.scheduler is None or self._slot.scheduler_recipe is not None \
                or self.scheduler is not None or self._slot.saved_state is not None \
                or not self.warns_unrestored_optimizer:
            return  # (pending: the first build_optimizer says it; the PerforatedAI recipe
            # builds a fresh optimizer and scheduler after its load, as PerforatedAI does)
        warn_user(f"{name} holds the state of the LR scheduler its run stepped "
                  f"(last_epoch {run.scheduler.get('last_epoch', '?')}), and none is "
                  "registered here, so the learning rate stays where it is from now on. To "
                  "continue the schedule, register the same class before the load: "
                  "controller.set_scheduler(cls, **kwargs) before load(), or "
                  "perfora.resume(..., scheduler=cls, scheduler_args={...})")

    def _keep_unrestored_optimizer(self, run: SavedRun, reader: Checkpointer,
                                   name: str) -> None:
        """A load that found no optimizer perfora builds: a file's optimizer state waits for
        the first ``build_optimizer``; otherwise the user is told it was not restored."""
        slot = self._slot
        if slot.user_owned:
            warn_user(f"{name} holds optimizer state that perfora did not restore into the "
                      "optimizer registered with set_optimizer_instance. To continue the run "
                      "exactly, register its class with controller.set_optimizer(...) "
                      "before load() (perfora then builds it and restores its state)")
        elif slot.optimizer is None and reader.format == "file":
            slot.saved_state = partial(self._restore_saved_optimizer, reader, run)
        elif slot.optimizer is None:
            warn_user(f"{name} holds optimizer state that was not restored: no optimizer is "
                      "registered, and a DCP folder's is read with the model. To continue the "
                      "run exactly, call controller.set_optimizer(...) (and set_scheduler) "
                      "before load()")

    def _restore_saved_optimizer(self, reader: Checkpointer, run: SavedRun) -> None:
        """The checkpoint's optimizer and scheduler state into the ones just built, checked
        first on a weightless copy as a load into registered ones is (CheckpointError where
        they do not fit: the ones built stay fresh)."""
        parts = self._parts()
        reader.check(parts, run, rehearsed=False)
        reader.load_rest(parts, run)
        if self.scheduler is not None and run.scheduler is not None:
            self.scheduler.load_state_dict(with_keys_of(run.scheduler,
                                                        self.scheduler.state_dict()))
        self._slot.scheduler_mark = None  # its step count is the checkpoint's now
        self._warn_unrestored_scheduler(run, "the loaded checkpoint")

    def _settle_direction(self, run: SavedRun) -> None:
        """Refuse (ConfigError) or, where this controller adopts it, take the saved run's
        ``maximize`` when it differs from the settings in force."""
        saved = (run.config or {}).get("maximize")
        if self.adopts_saved_direction and isinstance(saved, bool):
            if saved != self.config.maximize:
                self.config = self.config.replace(maximize=saved)
            return
        run.check_direction(self.config)

    def find_checkpoint(self, name: str) -> Path:
        """Checkpoint ``name`` in run_dir: the newest of its file and DCP folder, or the path
        the format in force writes when neither is there."""
        folder = self.checkpoint_path(name).parent
        return newest_checkpoint([self.checkpoint_path(name), folder / f"{name}{FILE_SUFFIX}",
                                  folder / f"{name}{DCP_SUFFIX}"])

    def load_state(self, meta: Mapping[str, Any],
                   best: Mapping[str, torch.Tensor] | None = None) -> None:
        """Restore the controller, rule and best snapshot without touching the weights.

        For frameworks that restore the weights themselves (Lightning): the model must
        already have the saved structure. ``meta`` is :meth:`state_dict` plus
        ``best_structure``; ``best`` the best snapshot's tensors. Everything is checked
        first: a state that is malformed or does not fit raises CheckpointError and leaves
        the controller as it was."""
        self._restore(framework_state(meta, best, self.model, self.backend, self.config))

    @classmethod
    def from_checkpoint(cls, path: str | Path | nn.Module, model: nn.Module | str | Path,
                        config: PerforaConfig | Mapping[str, Any] | None = None, *,
                        optimizer: type | None = None,
                        optimizer_args: dict[str, Any] | None = None,
                        scheduler: type | None = None,
                        scheduler_args: dict[str, Any] | None = None,
                        run_dir: str | Path | None = None, **settings: Any) -> Self:
        """A controller continuing the run saved in ``path`` on a freshly built ``model``.

        The file is read once; the keywords are :func:`perfora.resume`'s (``optimizer``,
        ``optimizer_args``, ``scheduler``, ``scheduler_args``, ``run_dir``, settings).
        ``config`` replaces the saved settings (default: the checkpoint's). The path and the
        model may come in either order."""
        model, path = model_and_path(path, model, "from_checkpoint(path, model)")
        backend = backend_of(model)
        backend.check_load()  # a backend that cannot take a load refuses, naming what to do
        reader = checkpointer_for(path)
        run = reader.read(path)
        config = run.settings(config, settings)
        run.check_direction(config)
        rehearsed = reader.prepare_model(
            model, backend, run, config,
            OptimizerRecipe(optimizer, dict(optimizer_args or {})) if optimizer else None,
            SchedulerRecipe(scheduler, dict(scheduler_args or {})) if scheduler else None)
        ctl = cls(model, config, run_dir=run_dir if run_dir is not None else run.folder)
        if optimizer is not None:
            ctl.set_optimizer(optimizer, **(optimizer_args or {}))
        if scheduler is not None:
            ctl.set_scheduler(scheduler, **(scheduler_args or {}))
        ctl._restore(run, reader, rehearsed)
        ctl._slot.scheduler_mark = None  # its step count is the checkpoint's now
        ctl._warn_unrestored_scheduler(run, Path(str(path)).name)
        return ctl


def _bare_name(path: str | Path) -> bool:
    """A checkpoint name (``latest``, ``switch_3``): no folder, no suffix."""
    text = str(path)
    return bool(text) and "/" not in text and "\\" not in text and not Path(text).suffix
