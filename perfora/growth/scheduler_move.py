"""Move a learning-rate scheduler you step yourself onto the optimizer rebuilt at a restructure.

A per-batch schedule (warm-up, ``OneCycleLR``, ``get_linear_schedule_with_warmup``) stays
with the user, but it holds the optimizer it was built over. After a restructure that
optimizer no longer trains the model: :func:`move_scheduler` points the scheduler at the new
one, so the schedule goes on from the step it had reached instead of starting again.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError

_NOT_CARRIED = ("params",)


def move_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer) -> Any:
    """Point ``scheduler`` (and the schedulers a ``SequentialLR``/``ChainedScheduler`` holds)
    at ``optimizer``; returns ``scheduler``.

    Each new param group takes its old twin's settings (``lr``, ``initial_lr``, a cyclic
    schedule's ``max_lr``/``momentum``...), so the next ``scheduler.step()`` gives the
    rate it would have given the old optimizer. Call it with ``decision.optimizer`` after
    each ``decision.restructured``; the old and new optimizers need the same number of
    param groups."""
    inner = getattr(optimizer, "optimizer", optimizer)  # an Accelerate/Fabric wrapper's own
    if not isinstance(inner, torch.optim.Optimizer):
        raise ConfigError(f"move_scheduler needs the new torch optimizer (decision.optimizer), "
                          f"got {type(optimizer).__name__}")
    old = getattr(scheduler, "optimizer", None)
    old = getattr(old, "optimizer", old)
    if not isinstance(old, torch.optim.Optimizer):
        raise ConfigError(f"move_scheduler needs a torch LR scheduler (one with .optimizer), "
                          f"got {type(scheduler).__name__}")
    if old is inner:
        return scheduler
    if len(old.param_groups) != len(inner.param_groups):
        raise ConfigError(f"the scheduler's optimizer has {len(old.param_groups)} param groups "
                          f"and the new one {len(inner.param_groups)}: a scheduler keeps one "
                          "rate per group, so it can only move to an optimizer built the same "
                          "way (decision.optimizer, from the registered recipe)")
    carry_group_settings(old, inner)
    _point_at(scheduler, inner)
    return scheduler


def carry_group_settings(old: torch.optim.Optimizer, new: torch.optim.Optimizer) -> None:
    """Give each of ``new``'s param groups its twin's settings in ``old`` (``lr``,
    ``initial_lr``, a cyclic schedule's ``max_lr``...): all but the parameters."""
    for before, after in zip(old.param_groups, new.param_groups, strict=True):
        for key, value in before.items():
            if key not in _NOT_CARRIED:
                after[key] = value


def _point_at(scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Set ``optimizer`` on ``scheduler`` and on every scheduler it chains."""
    scheduler.optimizer = optimizer
    for inner in getattr(scheduler, "_schedulers", ()):
        _point_at(inner, optimizer)
    optimizer._opt_called = True  # it has stepped: torch's order check stays quiet
