"""What the controller knows: its JSON-able state, the best snapshot, actions and decisions."""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch
from torch import nn

from ..errors import ScoreError


class Action(StrEnum):
    """What a decision tells the training loop; the values are what users and metrics.csv see."""

    CONTINUE = "continue"
    RESTRUCTURE = "restructure"
    PHASE_CHANGE = "phase_change"
    COMPLETE = "complete"


CONTINUE, RESTRUCTURE, PHASE_CHANGE, COMPLETE = (Action.CONTINUE, Action.RESTRUCTURE,
                                                 Action.PHASE_CHANGE, Action.COMPLETE)


@dataclass
class Decision:
    """The controller's answer to one epoch's score."""

    action: str
    reason: str
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    epoch: int
    num_dendrites: int
    phase: str

    @property
    def restructured(self) -> bool:
        """True when what trains changed: rebuild anything that holds the parameters."""
        return self.action in (RESTRUCTURE, PHASE_CHANGE)

    @property
    def complete(self) -> bool:
        """True when growth is over; the model now holds the best weights."""
        return self.action == COMPLETE


@dataclass
class ControllerState:
    """Everything the controller decides from; JSON-able, saved in every checkpoint.

    ``history`` holds one row per epoch reported in this process (after a resume: the rows
    read back from metrics.csv); a checkpoint saves only its newest rows."""

    epoch: int = 0
    cycle_start_epoch: int = 0
    cycle_scores: list[float] = field(default_factory=list)
    cycle_best: float | None = None
    last_improved_epoch: int = 0
    cycle_set_global_best: bool = False
    global_best: float | None = None
    best_epoch: int | None = None
    best_test: float | None = None
    num_dendrites: int = 0
    tries: int = 0
    additions: int = 0
    completed: bool = False
    switch_epochs: list[int] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    arch: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self, history_rows: int | None = None) -> dict[str, Any]:
        """A shallow copy as a dict: rows are flat dicts of numbers (no deep copy of history).

        ``history_rows``: keep only the newest rows of ``history``. A checkpoint keeps a few
        (no decision reads them; the full history is in metrics.csv), so its JSON does not
        grow with the number of epochs."""
        data = {f.name: copy.copy(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name != "history"}
        keep = len(self.history) if history_rows is None else max(0, history_rows)
        rows = self.history[max(0, len(self.history) - keep):] if keep else []
        data["history"] = list(rows)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ControllerState:
        """The state from a dict, ignoring unknown keys (files of newer versions)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class BestSnapshot:
    """The best model so far, kept in memory for the rewind: its structure and tensors."""

    structure: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    def as_tuple(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(structure, tensors), the public shape of ``GrowthController.best_snapshot``."""
        return self.structure, self.tensors


def as_score(value: Any, what: str = "validation score") -> float:
    """A finite float from a number, 0-d tensor or numpy scalar; ScoreError otherwise."""
    if isinstance(value, bool):
        raise ScoreError(f"the {what} must be a number, got a bool ({value})")
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool:
            raise ScoreError(f"the {what} must be a number, got a bool tensor ({value}); "
                             "report e.g. accuracy as a float")
        if value.numel() != 1:
            raise ScoreError(f"the {what} must be one number, got a tensor of shape "
                             f"{tuple(value.shape)}; reduce it first (e.g. .mean())")
        value = value.detach().cpu().item()
    elif hasattr(value, "item") and callable(value.item) and not isinstance(value, str):
        try:
            value = value.item()
        except (TypeError, ValueError) as exc:
            raise ScoreError(f"the {what} must be one number, got {value!r}") from exc
    if not isinstance(value, numbers.Real):
        raise ScoreError(f"the {what} must be a number, got {type(value).__name__} "
                         f"({value!r})")
    try:
        value = float(value)
    except OverflowError:
        raise ScoreError(f"the {what} is too large for a float ({str(value)[:20]}...); "
                         "report a finite number") from None
    if not math.isfinite(value):
        raise ScoreError(f"the {what} is {value}: training probably diverged (lower the "
                         "learning rate) or the metric divided by zero; report a finite "
                         "number")
    return value
