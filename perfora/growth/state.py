"""What the controller knows: its JSON-able state (and the checks a saved one passes), the
best snapshot, actions and decisions."""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any

import torch
from torch import nn

from ..checkpoint.schema import (
    MAX_DENDRITES,
    check_bool,
    check_dict,
    check_int,
    check_list,
    check_number,
    check_optional,
    check_str,
    fail,
)
from ..errors import CheckpointError, ScoreError


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


GROWTH_STEP_KINDS = ("dendrites", "neurons")


def _each(check: Callable[[Any, str], Any]) -> Callable[[Any, str], None]:
    def check_items(values: Any, where: str) -> None:
        for i, value in enumerate(check_list(values, where)):
            check(value, f"{where}[{i}]")
    return check_items


_NUMERIC_COLUMNS = ("val_score", "running_score", "test_score", "lr", "params", "seconds",
                    "dendrites", "widenings", "rewound_to")


def _check_history(rows: Any, where: str) -> None:
    """History rows: flat dicts with an ``epoch``, numbers in the numeric columns."""
    for i, row in enumerate(check_list(rows, where)):
        at = f"{where}[{i}]"
        row = check_dict(row, at)
        if "epoch" not in row:
            raise CheckpointError(f"{at}.epoch: missing")
        check_int(row["epoch"], f"{at}.epoch")
        for key, value in row.items():
            cell = f"{at}[{key!r}]"
            if key in _NUMERIC_COLUMNS or key.startswith(("extra/", "rule/")):
                check_number(value, cell, finite=False, optional=True)
            elif key in ("phase", "event", "reason", "grown"):
                check_str(value, cell, optional=True)
            elif not (value is None or isinstance(value, bool | int | float | str)):
                raise fail(cell, "a number, string or null", value)
            if isinstance(value, str) and len(value) > 4096:
                raise fail(cell, "a string of at most 4096 characters", value)


def _check_arch(arch: Any, where: str) -> None:
    """The best score of each architecture, keyed by its dendrite count."""
    for key, entry in check_dict(arch, where).items():
        at = f"{where}[{key!r}]"
        if not re.fullmatch(r"\d{1,6}", key):
            raise fail(where, "dendrite counts as keys", key)
        entry = check_dict(entry, at)
        for name in ("dendrites", "params", "epoch"):
            if name not in entry:
                raise CheckpointError(f"{at}.{name}: missing")
            check_int(entry[name], f"{at}.{name}")
        if "best_val_score" not in entry:
            raise CheckpointError(f"{at}.best_val_score: missing")
        check_number(entry["best_val_score"], f"{at}.best_val_score")
        check_optional(entry, "test_score", at, check_number, optional=True)


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
    first_score: float | None = None
    """The first score the policy saw: how far the best has come from it tells
    ``dendrite_optimizer='auto'`` whether the network is still near its start (files of
    versions before it: None)."""
    num_dendrites: int = field(default=0, metadata={
        "check": partial(check_int, low=0, high=MAX_DENDRITES)})
    num_widenings: int = field(default=0, metadata={
        "check": partial(check_int, low=0, high=MAX_DENDRITES)})
    """Neuron growth steps the model holds (the most of any layer)."""
    num_steps: int = field(default=0, metadata={
        "check": partial(check_int, low=0, high=2 * MAX_DENDRITES)})
    """Growth steps of either kind the model holds (the most of any layer): growth='auto'."""
    auto_kind: str = field(default="dendrites", metadata={
        "check": partial(check_str, choices=GROWTH_STEP_KINDS)})
    """growth='auto': the kind the next growth step adds (the one that paid last)."""
    auto_failed: bool = False
    """growth='auto': the other kind's step failed just before the current kind's."""
    tries: int = 0
    additions: int = 0
    completed: bool = False
    switch_epochs: list[int] = field(default_factory=list)
    growth_kinds: list[str] = field(default_factory=list, metadata={
        "check": _each(partial(check_str, choices=GROWTH_STEP_KINDS))})
    """The kind of each growth step in ``switch_epochs``, 'dendrites' or 'neurons' (files
    of versions before it: empty)."""
    history: list[dict[str, Any]] = field(default_factory=list,
                                          metadata={"check": _check_history})
    arch: dict[str, dict[str, Any]] = field(default_factory=dict,
                                            metadata={"check": _check_arch})

    def growth_steps(self, growth: str) -> int:
        """Growth steps of kind ``growth`` ('dendrites', 'neurons', 'auto') the model holds."""
        return {"neurons": self.num_widenings, "auto": self.num_steps}.get(growth,
                                                                         self.num_dendrites)

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

    @classmethod
    def from_saved(cls, data: Any, source: str = "the saved perfora state") -> ControllerState:
        """The state from JSON a checkpoint holds, every field checked first (CheckpointError
        naming ``source`` and the field otherwise)."""
        try:
            return cls.from_dict(validate_controller_state(data))
        except CheckpointError as exc:
            raise CheckpointError(f"{source}: {exc}") from None


def _optional_int(value: Any, where: str) -> None:
    if value is not None:
        check_int(value, where)


_CHECK_BY_TYPE: dict[str, Callable[[Any, str], Any]] = {
    "int": check_int, "bool": check_bool, "int | None": _optional_int,
    "float | None": partial(check_number, optional=True),
    "list[int]": _each(check_int), "list[float]": _each(check_number)}
_FIELD_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    f.name: f.metadata.get("check") or _CHECK_BY_TYPE[f.type]
    for f in dataclasses.fields(ControllerState)}
"""How each saved field of :class:`ControllerState` is checked: by its type (counters are
ints >= 0, scores finite numbers), or by the check its field declares."""


def validate_controller_state(data: Any, where: str = "controller") -> dict[str, Any]:
    """The controller state as :meth:`ControllerState.to_dict` writes it: every field that is
    present checked (CheckpointError naming it, e.g. ``controller.epoch``); unknown keys
    (files of newer versions) are left alone."""
    data = check_dict(data, where)
    for name, check in _FIELD_CHECKS.items():
        if name in data:
            check(data[name], f"{where}.{name}")
    return data


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
    if isinstance(value, (list, tuple)):
        raise ScoreError(f"the {what} must be one number, got a {type(value).__name__} of "
                         f"{len(value)} ({str(value)[:60]}); reduce it first (e.g. "
                         "sum(values) / len(values), or the metric over the whole set)")
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
