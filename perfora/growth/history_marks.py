"""What the growth history records and its plot marks: each growth step's kind, and what a
rewind to the best model undid.

A restructure row of the history names the kind it grew (``grown``: 'dendrites' or
'neurons'), and a row whose decision went back to the best model names that model's epoch
(``rewound_to``). A step grown after epoch ``s`` is undone when a later rewind, at epoch
``t``, went back to a best epoch ``b`` with ``b <= s < t``: the best snapshot is taken before
that epoch's growth, so the step is not in it. Rows written before these columns existed give
the kind from their reason, and no rewinds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KINDS = ("dendrites", "neurons")


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
    if grown in KINDS:
        return str(grown)
    return "neurons" if "added neuron step" in str(row.get("reason") or "") else "dendrites"


def history_marks(history: Sequence[Mapping[str, Any]],
                  switch_epochs: Sequence[int]) -> HistoryMarks:
    """The growth steps at ``switch_epochs`` with their kinds, and which rewinds undid them."""
    rows = {row.get("epoch"): row for row in history}
    rewinds = [(int(row["rewound_to"]), int(row["epoch"])) for row in history
               if isinstance(row.get("rewound_to"), int)]
    steps = [GrowthMark(epoch, _kind(rows.get(epoch, {})),
                        any(best <= epoch < at for best, at in rewinds))
             for epoch in switch_epochs]
    return HistoryMarks(steps, [(best, at) for best, at in rewinds if at > best])
