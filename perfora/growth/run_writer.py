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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .._version import __version__
from ..checkpoint.dcp import DCP_SUFFIX, copy_dcp
from ..checkpoint.files import atomic_write_bytes
from ..checkpoint.format import encode_checkpoint, to_storable
from ..config import PerforaConfig
from ..distributed.collectives import is_rank_zero
from .dcp_checkpoint import DCP, resolve_format, save_dcp_checkpoint, warn_single_process
from .report import RunReport
from .state import CONTINUE, RESTRUCTURE

if TYPE_CHECKING:
    from .controller import GrowthController

CHECKPOINT_SUFFIX = ".safetensors"


@dataclass(frozen=True)
class Gathered:
    """The full model and optimizer state, gathered once on every rank for one write (FSDP)."""

    model: dict[str, torch.Tensor]
    optimizer: tuple[dict[str, torch.Tensor], dict] | None
    best: dict[str, torch.Tensor] | None  # the best snapshot whole (FSDP2 keeps shards)


class RunWriter:
    """Writes one controller's run files on rank 0; decides when a checkpoint write is due."""

    def __init__(self, config: PerforaConfig, run_dir: str | Path | None,
                 write_files: bool) -> None:
        self.config = config
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.write_files = write_files
        self.best_unsaved = False  # the best snapshot changed since "best" was written
        self.gathered: Gathered | None = None  # set only while a sharded write is under way
        self._last_write = time.perf_counter()
        self._write_cost = 0.0
        self._warned_format = False
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

    def due(self, action: str, epoch: int, sharded: bool) -> bool:
        """Whether this epoch's report writes checkpoints: restructures and the end always,
        plain epochs every ``latest_every`` when the time budget allows (not when sharded:
        every rank must decide alike)."""
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
        return time.perf_counter() - self._last_write >= self._write_cost / budget

    def checkpoint_path(self, name: str) -> Path:
        """``run_dir/<name>.safetensors``."""
        assert self.run_dir is not None
        return self.run_dir / f"{name}{CHECKPOINT_SUFFIX}"

    def dcp_path(self, name: str) -> Path:
        """``run_dir/<name>.dcp`` (a DCP checkpoint folder)."""
        assert self.run_dir is not None
        return self.run_dir / f"{name}{DCP_SUFFIX}"

    def uses_dcp(self, ctl: GrowthController) -> bool:
        """True when checkpoints are DCP folders now (``checkpoint_format``, the backend and
        the world size decide; the same on every rank)."""
        setting = self.config.checkpoint_format
        if not self._warned_format and self.saves_checkpoints:
            self._warned_format = warn_single_process(setting)
        return resolve_format(setting, ctl.backend) == DCP

    def gather(self, ctl: GrowthController, due: bool) -> None:
        """Sharded and due: gather the full model and optimizer state on every rank."""
        if due and ctl.backend.sharded and self.saves_checkpoints:
            optimizer = self.optimizer_state(ctl)
            self.gathered = Gathered(to_storable(ctl.backend.full_state(ctl.model)), optimizer,
                                     self.best_state(ctl))

    def model_state(self, ctl: GrowthController) -> dict[str, torch.Tensor]:
        """The full model state: gathered for this write, or read now (sharded: collective)."""
        if self.gathered is not None:
            return self.gathered.model
        return ctl.backend.full_state(ctl.model)

    def best_state(self, ctl: GrowthController) -> dict[str, torch.Tensor] | None:
        """The best snapshot's tensors whole: gathered for this write, or now (a collective
        under FSDP2, whose snapshots hold each rank's shards)."""
        if self.gathered is not None:
            return self.gathered.best
        return None if ctl._best is None else ctl.backend.whole(ctl._best.tensors)

    def optimizer_state(self, ctl: GrowthController
                        ) -> tuple[dict[str, torch.Tensor], dict] | None:
        """(tensors, JSON) of the optimizer state (under FSDP2 full tensors by parameter
        name, so a resumed run matches entries whatever order its optimizer has); None
        without an optimizer, or when it is stale (it holds replaced parameters)."""
        if ctl.optimizer is None:
            return None
        if self.gathered is not None:  # gathered together with the model
            return self.gathered.optimizer
        return ctl.backend.optimizer_state(ctl.optimizer, ctl.model)

    def end_epoch(self, ctl: GrowthController, action: str, improved_best: bool) -> None:
        """After one report: metrics, checkpoints when due, summaries after a decision."""
        dcp = self.uses_dcp(ctl)
        due = self.due(action, ctl.state.epoch, ctl.backend.sharded or dcp)
        if not dcp:
            self.gather(ctl, due)
        try:
            if self.writes:
                assert self.report is not None
                self.report.write_metrics(ctl.state.history)
            if self.saves_checkpoints and (dcp or self.writes):
                self.best_unsaved |= improved_best
                if due:
                    self.write_checkpoints(ctl, action, dcp)
            if self.writes and action != CONTINUE:
                self.write_summaries(ctl)
        finally:
            self.gathered = None

    def write_switch(self, ctl: GrowthController) -> None:
        """After a growth on request: switch_N (gathered first when sharded; a DCP folder
        written by every rank)."""
        name = f"switch_{len(ctl.state.switch_epochs)}"
        if self.uses_dcp(ctl):
            if self.saves_checkpoints:
                save_dcp_checkpoint(ctl, self.dcp_path(name))
            return
        self.gather(ctl, True)
        try:
            if self.writes:
                ctl.save(ctl.checkpoint_path(name))
        finally:
            self.gathered = None

    def finish(self, ctl: GrowthController) -> None:
        """latest and the summaries now (also written at restructures and the end)."""
        has_history = bool(ctl.state.history)
        dcp = self.uses_dcp(ctl)
        if not dcp:
            self.gather(ctl, has_history)
        try:
            if self.saves_checkpoints and has_history and (dcp or self.writes):
                self.write_checkpoints(ctl, CONTINUE, dcp)
            if self.writes:
                self.write_summaries(ctl)
        finally:
            self.gathered = None

    def write_summaries(self, ctl: GrowthController) -> None:
        """best_arch_scores.csv and history.png."""
        if self.report is None:
            return
        st = ctl.state
        self.report.write_arch_table([st.arch[k] for k in sorted(st.arch, key=int)])
        self.report.draw_history(st.history, st.switch_epochs, self.config.maximize)

    def write_checkpoints(self, ctl: GrowthController, action: str, dcp: bool = False) -> None:
        """latest (+ switch_N at a restructure, + best if it changed), each encoded once."""
        if dcp:
            self.write_dcp_checkpoints(ctl, action)
            return
        start = time.perf_counter()
        data = encode_checkpoint(ctl.to_checkpoint())
        if action == RESTRUCTURE:
            atomic_write_bytes(ctl.checkpoint_path(f"switch_{len(ctl.state.switch_epochs)}"),
                               data)
        atomic_write_bytes(ctl.checkpoint_path("latest"), data)
        if self.best_unsaved and ctl._best is not None:
            # "best" holds the best model itself, even if the model grew since
            best = encode_checkpoint(ctl.to_checkpoint(model_from_best=True))
            atomic_write_bytes(ctl.checkpoint_path("best"), best)
            self.best_unsaved = False
        self._last_write = time.perf_counter()
        self._write_cost = self._last_write - start


    def write_dcp_checkpoints(self, ctl: GrowthController, action: str) -> None:
        """latest (+ switch_N at a restructure: hard links to latest's files, + best if it
        changed) as DCP folders; every rank writes its shards (a collective)."""
        start = time.perf_counter()
        latest = self.dcp_path("latest")
        save_dcp_checkpoint(ctl, latest)
        if action == RESTRUCTURE:
            copy_dcp(latest, self.dcp_path(f"switch_{len(ctl.state.switch_epochs)}"))
        if self.best_unsaved and ctl._best is not None:
            save_dcp_checkpoint(ctl, self.dcp_path("best"), model_from_best=True)
            self.best_unsaved = False
        self._last_write = time.perf_counter()
        self._write_cost = self._last_write - start
