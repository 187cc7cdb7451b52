"""Rebuild the user's optimizer and scheduler, same types and arguments, over what trains."""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError


@dataclass
class OptimizerRecipe:
    """An optimizer class and its keyword arguments, given once by the user."""

    cls: type[torch.optim.Optimizer]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.cls, type) and issubclass(self.cls, torch.optim.Optimizer)):
            if isinstance(self.cls, torch.optim.Optimizer):
                raise ConfigError(f"set_optimizer needs an optimizer class such as "
                                  f"torch.optim.Adam, got a {type(self.cls).__name__} you "
                                  "built: give set_optimizer_instance(optimizer) that one")
            raise ConfigError(f"set_optimizer needs an optimizer class such as "
                              f"torch.optim.Adam, got {self.cls!r}")
        self.kwargs = {k: v for k, v in self.kwargs.items() if k != "params"}
        check_arguments(self.cls, self.kwargs)

    def build(self, model: nn.Module) -> torch.optim.Optimizer:
        """A new optimizer over the parameters that currently require a gradient."""
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError("no parameter of the model requires a gradient; nothing to "
                              "optimize")
        return self.cls(params, **self.kwargs)


@dataclass
class SchedulerRecipe:
    """A scheduler class and its keyword arguments (the optimizer is given at build time)."""

    cls: type
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.cls, type):
            raise ConfigError(f"set_scheduler needs a scheduler class such as "
                              f"torch.optim.lr_scheduler.StepLR, got {self.cls!r}")
        self.kwargs = {k: v for k, v in self.kwargs.items() if k != "optimizer"}
        check_arguments(self.cls, self.kwargs)

    def build(self, optimizer: torch.optim.Optimizer) -> Any:
        return self.cls(optimizer, **self.kwargs)


def check_arguments(cls: type, kwargs: dict[str, Any]) -> None:
    """Refuse, when registered, arguments the class would refuse at its first build (an
    unknown name, a missing required one), not epochs later at a restructure."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to read: the build will say
        return
    try:
        signature.bind(None, **kwargs)  # the parameters (or optimizer) come first
    except TypeError as error:
        takes = [n for n in signature.parameters if n not in ("self", "params", "optimizer")]
        raise ConfigError(f"the arguments given for {cls.__name__}: {error}; it takes "
                          f"{', '.join(takes)}") from None


def is_plateau(scheduler: Any) -> bool:
    """True for ReduceLROnPlateau, which is stepped with the score."""
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def step_scheduler(scheduler: Any, score: float, maximize: bool) -> None:
    """ReduceLROnPlateau gets the score; every other scheduler steps once per epoch."""
    if scheduler is None:
        return
    if is_plateau(scheduler):
        scheduler.step(score)
    else:
        scheduler.step()


def check_plateau_mode(scheduler: Any, maximize: bool) -> None:
    """Warn once when ReduceLROnPlateau's mode contradicts the score direction."""
    if is_plateau(scheduler):
        want = "max" if maximize else "min"
        if scheduler.mode != want:
            warnings.warn(f"ReduceLROnPlateau has mode={scheduler.mode!r} but the validation "
                          f"score is {'maximized' if maximize else 'minimized'}; pass "
                          f"mode={want!r} to the scheduler", stacklevel=3)


def current_lr(optimizer: torch.optim.Optimizer | None) -> float | None:
    """The first parameter group's learning rate, or None without an optimizer."""
    if optimizer is None or not optimizer.param_groups:
        return None
    lr = optimizer.param_groups[0].get("lr")
    return float(lr) if lr is not None else None


