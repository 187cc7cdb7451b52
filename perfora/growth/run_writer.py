"""The run folder: when a write is due, and the files written then.

metrics.csv, best_arch_scores.csv, history.png and run.json (through RunReport), and the
checkpoints best/latest/switch_N: ``.safetensors`` files written by rank 0, or ``.dcp``
folders every rank writes its shards into (``checkpoint_format``). Plain epochs are written
only when the time since the last write pays for it (``checkpoint_time_budget``); sharded
models are gathered for a file, and DCP folders are written by every rank (collectives), so
there the decision never depends on time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from .._version import __version__
from ..checkpoint.dcp import DCP_SUFFIX
from ..checkpoint.format import to_storable
from ..config import PerforaConfig
from ..distributed.collectives import is_rank_zero, rank_zero_decides
from ..parallel.base import ParallelBackend
from ..warn import warn_user
from .checkpointer import checkpointer_for, warn_single_process
from .file_checkpointer import FILE_SUFFIX
from .report import RunReport
from .saved_run import Captured, Checkpointer, RunParts, saved_run
from .state import CONTINUE, RESTRUCTURE, ControllerState

CheckpointPaths = Callable[[str], Path]
"""Where checkpoint ``name`` (``latest``, ``best``, ``switch_N``) goes: the controller's
``checkpoint_path`` (the compat controller names them as PerforatedAI does)."""


# the checkpoints a run writes (best_model, latest and switch_N: PerforatedAI's names)
CHECKPOINT_STEMS = ("latest", "best", "best_model", "switch_*", "final")


class RunWriter:
    """Writes one controller's run files on rank 0; decides when a checkpoint write is due."""

    def __init__(self, config: PerforaConfig, run_dir: str | Path | None,
                 write_files: bool, resume_hint: str = "controller.load('latest')") -> None:
        self.config = config
        self.resume_hint = resume_hint
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.write_files = write_files
        self.best_unsaved = False  # the best snapshot changed since "best" was written
        self._last_write = time.perf_counter()
        self._write_cost = 0.0
        self._warned_format = False
        # another run's files here: this run overwrites them (warned at its first report)
        self._earlier = (sorted(
            p.name for stem in CHECKPOINT_STEMS for suffix in (FILE_SUFFIX, DCP_SUFFIX, ".pt")
            for p in self.run_dir.glob(stem + suffix))
            + [p.name for p in self.run_dir.glob("metrics.csv")]) if self.writes else []
        self.report = RunReport(self.run_dir) if self.writes else None
        if self.report is not None:
            self.report.write_run_json({"perfora_version": __version__,
                                        "torch_version": torch.__version__,
                                        "config": config.to_dict()})

    @property
    def writes(self) -> bool:
        """True on the rank that writes files (rank 0, with a run_dir, writing enabled)."""
        return self.run_dir is not None and self.write_files and is_rank_zero()

    @property
    def saves_checkpoints(self) -> bool:
        """True when checkpoints are written (on rank 0; every rank gathers for them)."""
        return self.run_dir is not None and self.write_files and self.config.save_checkpoints

    @property
    def history_rows(self) -> int | None:
        """History rows a checkpoint keeps: with a run folder metrics.csv holds every row
        (``history_lookback`` are enough); without one the checkpoint holds them all."""
        return self.config.history_lookback if self.report is not None else None

    def due(self, action: str, epoch: int, sharded: bool, agree: bool = False) -> bool:
        """Whether this epoch's report writes checkpoints: restructures and the end always,
        plain epochs every ``latest_every`` when the time budget allows (not when sharded:
        every rank must decide alike). ``agree``: every rank reads the state for the file
        (DeepSpeed's optimizer), so rank 0's clock decides for all (a collective)."""
        cfg = self.config
        if not self.saves_checkpoints:
            return False
        if action != CONTINUE:
            return True
        if epoch % cfg.latest_every != 0:
            return False
        budget = cfg.checkpoint_time_budget
        if sharded or budget is None:
            return True
        wanted = time.perf_counter() - self._last_write >= self._write_cost / budget
        return rank_zero_decides(wanted) if agree else wanted

    def file_path(self, name: str) -> Path:
        """``run_dir/<name>.safetensors``."""
        assert self.run_dir is not None
        return self.run_dir / f"{name}{FILE_SUFFIX}"

    def dcp_path(self, name: str) -> Path:
        """``run_dir/<name>.dcp`` (a DCP checkpoint folder)."""
        assert self.run_dir is not None
        return self.run_dir / f"{name}{DCP_SUFFIX}"

    def checkpointer(self, backend: ParallelBackend) -> Checkpointer:
        """What writes this run's checkpoints now (``checkpoint_format``, the backend and the
        world size decide; the same on every rank)."""
        setting = self.config.checkpoint_format
        if not self._warned_format and self.saves_checkpoints:
            self._warned_format = warn_single_process(setting)
        return checkpointer_for(None, setting, backend)

    def checkpoint_path(self, name: str, backend: ParallelBackend) -> Path:
        """Where checkpoint ``name`` goes in run_dir in the format in force."""
        assert self.run_dir is not None
        return self.run_dir / f"{name}{self.checkpointer(backend).suffix}"

    def gather(self, parts: RunParts, checkpointer: Checkpointer, due: bool
               ) -> Captured | None:
        """Due, written whole and read collectively (a sharded model, or DeepSpeed's
        optimizer state): the full model and optimizer state, gathered once on every rank
        for rank 0's writes."""
        if due and parts.backend.capture_is_collective and self.saves_checkpoints \
                and not checkpointer.collective:
            captured = checkpointer.capture(parts)
            return replace(captured, model=to_storable(captured.model))
        return None

    def end_epoch(self, parts: RunParts, paths: CheckpointPaths, action: str,
                  improved_best: bool) -> None:
        """After one report: metrics, checkpoints when due, summaries after a decision."""
        if self._earlier:
            if parts.state.epoch == 1:  # a new run, not a resumed one
                warn_user(f"run_dir {self.run_dir} already holds another run's files "
                          f"({', '.join(self._earlier[:4])}): this run overwrites its latest, "
                          "best, metrics.csv and summaries, and its other files stay beside "
                          "them (a later resume from the newest switch_N may pick up that "
                          "run's). "
                          "Give each run its own run_dir (save_name under the PerforatedAI "
                          f"names), or resume that run: {self.resume_hint}")
            self._earlier = []
        checkpointer = self.checkpointer(parts.backend)
        collective = checkpointer.collective
        due = self.due(action, parts.state.epoch, parts.backend.sharded or collective,
                       agree=parts.backend.capture_is_collective)
        gathered = self.gather(parts, checkpointer, due)
        if self.writes:
            assert self.report is not None
            self.report.write_metrics(parts.state.history)
        if self.saves_checkpoints and (collective or self.writes):
            self.best_unsaved |= improved_best
            if due:
                self.write_checkpoints(parts, paths, action, checkpointer, gathered)
        if self.writes and action != CONTINUE:
            self.write_summaries(parts.state)

    def write_switch(self, parts: RunParts, paths: CheckpointPaths) -> None:
        """After a growth on request: switch_N and latest, as at a plateau's growth, so a run
        killed before its next report resumes grown (gathered first when sharded; a DCP
        folder written by every rank)."""
        def names() -> list[Path]:
            return [paths(f"switch_{len(parts.state.switch_epochs)}"), paths("latest")]

        checkpointer = self.checkpointer(parts.backend)
        if checkpointer.collective:
            if self.saves_checkpoints:
                checkpointer.write(saved_run(parts, checkpointer.capture(parts)), names())
            return
        gathered = self.gather(parts, checkpointer, True)
        if self.writes:
            captured = gathered or checkpointer.capture(parts)
            checkpointer.write(saved_run(parts, captured), names())

    def finish(self, parts: RunParts, paths: CheckpointPaths) -> None:
        """latest and the summaries now (also written at restructures and the end)."""
        has_history = bool(parts.state.history)
        checkpointer = self.checkpointer(parts.backend)
        gathered = self.gather(parts, checkpointer, has_history)
        if self.saves_checkpoints and has_history and (checkpointer.collective or self.writes):
            self.write_checkpoints(parts, paths, CONTINUE, checkpointer, gathered)
        if self.writes:
            self.write_summaries(parts.state)

    def write_summaries(self, state: ControllerState) -> None:
        """best_arch_scores.csv and history.png."""
        if self.report is None:
            return
        self.report.write_arch_table([state.arch[k] for k in sorted(state.arch, key=int)])
        self.report.draw_history(state.history, state.switch_epochs, self.config.maximize,
                                 state.growth_kinds)

    def write_checkpoints(self, parts: RunParts, paths: CheckpointPaths, action: str,
                          checkpointer: Checkpointer, gathered: Captured | None = None) -> None:
        """latest (+ switch_N at a restructure, + best if it changed), each encoded once (a
        DCP folder: written by every rank, switch_N hard links to latest's files)."""
        start = time.perf_counter()
        captured = gathered or checkpointer.capture(parts)
        names = ["latest"]
        if action == RESTRUCTURE:
            names.insert(0, f"switch_{len(parts.state.switch_epochs)}")
        checkpointer.write(saved_run(parts, captured), [paths(name) for name in names])
        if self.best_unsaved and parts.best is not None:
            # "best" holds the best model itself, even if the model grew since
            checkpointer.write(saved_run(parts, captured, model_from_best=True),
                               [paths("best")])
            self.best_unsaved = False
        self._last_write = time.perf_counter()
        self._write_cost = self._last_write - start
