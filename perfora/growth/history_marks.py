"""What the growth history records and its plot marks: each growth step's kind, and what a
rewind to the best model undid.

A restructure row of the history names the kind it grew (``grown``: 'dendrites' or
'neurons'), and a row whose decision went back to the best model names that model's epoch
(``rewound_to``). A step grown after epoch ``s`` is undone when a later rewind, at epoch
``t``, went back to a best epoch ``b`` with ``b <= s < t``: the best snapshot is taken before
that epoch's growth, so the step is not in it. The controller state records each step's kind
(``growth_kinds``, also for a growth on request, which writes no row); a state saved before
it did takes the kind from the history rows, and rows written before these columns existed
from their reason (and give no rewinds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .state import GROWTH_STEP_KINDS


@dataclass(frozen=True)
class GrowthMark:
    """One growth step: grown after ``epoch``; ``undone`` when a later rewind dropped it."""

    epoch: int
    kind: str
    undone: bool


@dataclass(frozen=True)
class HistoryMarks:
    """The growth steps, and the spans ``(best epoch, rewind epoch)`` of epochs undone."""

    steps: list[GrowthMark]
    undone_spans: list[tuple[int, int]]


def decision_cells(grown: str | None, rewound_to: int | None) -> dict[str, Any]:
    """The cells a decision adds to its history row: the kind it grew, and the best epoch it
    went back to first (each only when there is one)."""
    return {key: value for key, value in (("grown", grown), ("rewound_to", rewound_to))
            if value is not None}


def _kind(row: Mapping[str, Any]) -> str:
    """The kind a restructure row grew: its ``grown`` cell, else read from its reason."""
    grown = row.get("grown")
    if grown in GROWTH_STEP_KINDS:
        return str(grown)
    return "neurons" if "added neuron step" in str(row.get("reason") or "") else "dendrites"


def history_marks(history: Sequence[Mapping[str, Any]], switch_epochs: Sequence[int],
                  kinds: Sequence[str] = ()) -> HistoryMarks:
    """The growth steps at ``switch_epochs`` with their kinds (``kinds``, one per step, as the
    controller state records them; else from the history rows), and which rewinds undid
    them."""
    rows = {row.get("epoch"): row for row in history}
    if len(kinds) != len(switch_epochs):  # a state saved before it recorded the kinds
        kinds = [_kind(rows.get(epoch, {})) for epoch in switch_epochs]
    rewinds = [(int(row["rewound_to"]), int(row["epoch"])) for row in history
               if isinstance(row.get("rewound_to"), int)]
    steps = [GrowthMark(epoch, kind, any(best <= epoch < at for best, at in rewinds))
             for epoch, kind in zip(switch_epochs, kinds, strict=True)]
    return HistoryMarks(steps, [(best, at) for best, at in rewinds if at > best])


_STEP_NAMES = {"dendrites": "dendrite set", "neurons": "neuron step"}


def describe_growth(marks: HistoryMarks) -> str:
    """The growth a run kept, in order, and how many steps were undone, e.g. '3 dendrite sets,
    then 2 neuron steps; 1 step undone (it did not beat the best score)'."""
    runs: list[list[Any]] = []
    for step in marks.steps:
        if step.undone:
            continue
        if runs and runs[-1][0] == step.kind:
            runs[-1][1] += 1
        else:
            runs.append([step.kind, 1])
    kept = ", then ".join(f"{n} {_STEP_NAMES[kind]}{'s' if n > 1 else ''}" for kind, n in runs)
    undone = sum(step.undone for step in marks.steps)
    text = kept or "nothing kept (the start network scored best)"
    if undone:
        text += (f"; {undone} step undone (it did not beat the best score)" if undone == 1
                 else f"; {undone} steps undone (they did not beat the best score)")
    return text
