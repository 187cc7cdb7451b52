"""Carry the learning-rate schedule over the optimizers a framework rebuilds at a growth step.

Lightning rebuilds the optimizers and schedulers from ``configure_optimizers`` after each
restructure; built afresh, a cosine schedule would start again from its peak and a
``ReduceLROnPlateau`` forget its reductions. :func:`capture_schedule` keeps the old ones'
settings and states, and :func:`restore_schedule` gives them to the new ones, so the
schedule goes on from the step it had reached.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..growth.scheduler_move import carry_group_settings


@dataclass
class SavedSchedule:
    """The optimizers and the states of the schedulers a rebuild replaces."""

    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    schedulers: list[tuple[type, dict[str, Any]]] = field(default_factory=list)


def capture_schedule(optimizers: Sequence[Any], schedulers: Sequence[Any]) -> SavedSchedule:
    """The optimizers and scheduler states before a rebuild (none: nothing to carry)."""
    return SavedSchedule(list(optimizers), [(type(s), s.state_dict()) for s in schedulers])


def restore_schedule(saved: SavedSchedule, optimizers: Sequence[Any],
                     schedulers: Sequence[Any]) -> None:
    """Give the rebuilt ``optimizers`` the old groups' rates and the rebuilt ``schedulers``
    the old states. Built differently (another count of optimizers, groups or schedulers, or
    another scheduler type), the new ones start afresh, with a warning."""
    if not saved.optimizers and not saved.schedulers:
        return
    olds = [_torch_optimizer(o) for o in saved.optimizers]
    news = [_torch_optimizer(o) for o in optimizers]
    why = _mismatch(olds, news, saved.schedulers, schedulers)
    if why:
        warnings.warn(f"perfora: the learning-rate schedule starts again after this growth "
                      f"step: configure_optimizers built {why} than before it", UserWarning,
                      stacklevel=3)
        return
    for old, new in zip(olds, news, strict=True):
        carry_group_settings(old, new)
    for (_, state), scheduler in zip(saved.schedulers, schedulers, strict=True):
        scheduler.load_state_dict(state)


def _torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a Lightning/Accelerate wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def _mismatch(olds: list[Any], news: list[Any], saved: list[tuple[type, dict]],
              schedulers: Sequence[Any]) -> str | None:
    """How the rebuilt optimizers and schedulers differ from the old, or None."""
    if len(olds) != len(news):
        return f"{len(news)} optimizers rather than {len(olds)}"
    groups = [(len(o.param_groups), len(n.param_groups)) for o, n in zip(olds, news)]
    if any(a != b for a, b in groups):
        return "optimizers with other numbers of param groups"
    if [kind for kind, _ in saved] != [type(s) for s in schedulers]:
        return (f"schedulers {[type(s).__name__ for s in schedulers]} rather "
                f"than {[kind.__name__ for kind, _ in saved]}")
    return None
