"""What the controller does when asked, not at a plateau: grow now, or restore the best model.

A mixin of :class:`~perfora.growth.controller.GrowthController`: each call restructures at
once (a collective under torch.distributed: every rank calls it) and returns what
``step()`` would have returned for the same change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ..config import PerforaConfig
from ..errors import OrderError
from ..parallel import ParallelBackend
from .neuron_growth import check_neuron_growth
from .run_writer import RunWriter
from .state import Action, BestSnapshot, ControllerState, Decision


class OnRequestMethods:
    """``add_dendrites``, ``add_neurons`` and ``restore_best`` of the controller."""

    model: nn.Module
    config: PerforaConfig
    backend: ParallelBackend
    state: ControllerState
    _best: BestSnapshot | None
    _writer: RunWriter
    _grow: Callable[..., str]
    _parts: Callable[[], Any]
    checkpoint_path: Callable[[str], Any]
    _decision: Callable[..., Decision]
    _rewind_to_best: Callable[[], None]
    _rebuild_after_change: Callable[[], None]
    _adopt: Callable[[nn.Module | None], None]

    def add_dendrites(self) -> Decision:
        """Add one dendrite set now (without waiting for a plateau), whatever ``growth``
        says; rebuilds the optimizer."""
        if self.state.completed:
            raise OrderError("add_dendrites() after training completed")
        self._adopt(None)  # the user's freezing now
        added = self._grow("dendrites")
        self._writer.write_switch(self._parts(), self.checkpoint_path)
        return self._decision(Action.RESTRUCTURE, "added on request"
                              + (f" ({added})" if added else ""))

    def add_neurons(self) -> Decision:
        """Add one neuron step now (without waiting for a plateau), whatever ``growth``
        says: every wrapped layer whose readers perfora finds gains ``neurons_per_step`` of
        its starting width, exactly; rebuilds the optimizer (its moments carried on).
        PerforationError/ParallelError, before anything changes, where no layer can gain
        neurons or the backend cannot widen."""
        if self.state.completed:
            raise OrderError("add_neurons() after training completed")
        check_neuron_growth(self.model, self.backend, self.config.replace(growth="neurons"))
        self._adopt(None)  # the user's freezing now
        added = self._grow("neurons")
        self._writer.write_switch(self._parts(), self.checkpoint_path)
        return self._decision(Action.RESTRUCTURE, f"added on request ({added})")

    def restore_best(self) -> nn.Module:
        """Give the model the best snapshot's structure and weights now; returns the model to
        use from then on (a new DDP/DataParallel wrapper where the structure changed).

        Completion does this itself; call it when your loop ends first (its epoch or step
        budget ran out), in a native loop, Lightning or elsewhere, so the run ends with its
        best model, not its last. The optimizer it manages is rebuilt over the restored
        model. Under torch.distributed every rank must call it. OrderError before any score
        was reported (there is no best model yet)."""
        if self._best is None:
            raise OrderError("restore_best() before any score was reported: there is no best "
                             "model yet; call step(score) once per evaluation first")
        self._rewind_to_best()
        self._rebuild_after_change()
        return self.model
