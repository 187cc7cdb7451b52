"""The controller's read-only views of its state: how far the run is, what it grew, the best
scores (one place, so the controller's class keeps to its decisions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .state import ControllerState


class ControllerViews:
    """Properties over ``state``, the learning rule's phase and the run files, for users and
    integrations."""

    state: ControllerState
    rule: Any
    _writer: Any

    @property
    def run_dir(self) -> Path | None:
        """The folder of the run files (None: none are written)."""
        return self._writer.run_dir

    @property
    def write_files(self) -> bool:
        """False on ranks (or runs) that write no files."""
        return self._writer.write_files

    @property
    def num_dendrites(self) -> int:
        """Dendrite sets currently in every wrapped layer."""
        return self.state.num_dendrites

    @property
    def epoch(self) -> int:
        """Epochs reported so far."""
        return self.state.epoch

    @property
    def completed(self) -> bool:
        """True once growth is over and the best model restored."""
        return self.state.completed

    @property
    def best_score(self) -> float | None:
        """The best (smoothed) validation score so far."""
        return self.state.global_best

    @property
    def best_test_score(self) -> float | None:
        """The test score given with the best validation score (None: none was given)."""
        return self.state.best_test

    @property
    def phase(self) -> str:
        """The learning rule's current phase."""
        return self.rule.phase
