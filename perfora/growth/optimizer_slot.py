"""The optimizer slot: who owns the optimizer, and what happens to it at a restructure.

Three owners: a recipe (``set_optimizer``/``set_scheduler``: perfora builds and rebuilds
it), the user (``set_optimizer_instance``: dropped at a restructure, the user builds and
registers the next; an epoch trained before they do is warned about, see
:mod:`perfora.usage`), or a framework (Lightning, HF Trainer: handed over each epoch, read
for the learning rate and saved, never rebuilt here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, OrderError
from ..nn.layers import unwrap_model
from ..parallel.base import ParallelBackend
from ..warn import warn_user
from .optim import OptimizerRecipe, SchedulerRecipe, check_plateau_mode, current_lr, step_scheduler
from .optimizer_carry import (
    capture,
    capture_engine,
    capture_whole,
    carry_engine_into,
    carry_into,
    carry_whole_into,
    narrowed,
)


class OptimizerSlot:
    """The optimizer and scheduler in use, and the recipe or owner they come from."""

    def __init__(self) -> None:
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.recipe: OptimizerRecipe | None = None
        self.scheduler_recipe: SchedulerRecipe | None = None
        self.user_owned = False
        self.awaiting_instance = False
        """True from a restructure that dropped the user's optimizer until they register one."""
        self.pending_carry: Any = None
        """What a growth step kept of an optimizer perfora does not rebuild (the user's, a
        framework's): carried into the next one registered or handed to
        ``carry_optimizer_state``, until the next score."""
        self.whole_carry = False
        """True when ``pending_carry`` holds whole tensors to load through the backend."""
        self.saved_state: Callable[[], None] | None = None
        """A checkpoint's optimizer and scheduler state, loaded while no optimizer was
        registered: restored into the first one ``build_optimizer`` builds."""
        self.scheduler_mark: tuple[Any, int] | None = None
        """(the scheduler, its ``last_epoch``) right after perfora last stepped it."""
        self.warned_double_step = False

    def set_recipe(self, cls: type[torch.optim.Optimizer], kwargs: dict[str, Any]) -> None:
        """Register the optimizer class and arguments; rebuilt after every restructure."""
        self.recipe = OptimizerRecipe(cls, dict(kwargs))
        self.user_owned = self.awaiting_instance = False

    def set_scheduler(self, cls: type, kwargs: dict[str, Any]) -> None:
        """Register the LR scheduler class and arguments (built now over an optimizer the
        user registered without one, and over each one registered later)."""
        self.scheduler_recipe = SchedulerRecipe(cls, dict(kwargs))
        if self.user_owned and self.optimizer is not None:
            self.scheduler = self.scheduler_recipe.build(self.optimizer)

    def build(self, model: nn.Module, maximize: bool) -> tuple[torch.optim.Optimizer, Any]:
        """(Re)build optimizer and scheduler over the model's trainable parameters."""
        if self.recipe is None:
            raise OrderError("build_optimizer() before set_optimizer(): register the "
                             "optimizer class first, e.g. ctl.set_optimizer(torch.optim.Adam, "
                             "lr=1e-3)")
        self.optimizer = self.recipe.build(unwrap_model(model))
        self.scheduler = None
        if self.scheduler_recipe is not None:
            self.scheduler = self.scheduler_recipe.build(self.optimizer)
            check_plateau_mode(self.scheduler, maximize)
            self.mark_scheduler()
        return self.optimizer, self.scheduler

    def mark_scheduler(self) -> None:
        """Note the scheduler's step count as perfora's own (after it built, stepped or
        loaded it), so that only steps taken elsewhere later count as a double step."""
        count = getattr(self.scheduler, "last_epoch", None)
        self.scheduler_mark = (self.scheduler, count) if isinstance(count, int) else None

    def set_instance(self, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> None:
        """Use the user's optimizer; they rebuild and register it after every restructure.

        Registering is the documented way, so it warns about nothing; an epoch trained after
        a restructure without a new one is what the usage check warns about, once."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise OrderError(f"set_optimizer_instance needs a torch.optim.Optimizer, got "
                             f"{type(optimizer).__name__}")
        self.drop_saved_state("an optimizer registered with set_optimizer_instance is the "
                              "user's to restore")
        if scheduler is None and self.scheduler_recipe is not None:
            scheduler = self.scheduler_recipe.build(optimizer)  # set_scheduler's, over yours
        self.optimizer, self.scheduler = optimizer, scheduler
        self.user_owned = True
        self.awaiting_instance = False
        self.recipe = None

    def hand_over(self, optimizer: torch.optim.Optimizer | None) -> None:
        """A framework's current optimizer: read for the learning rate and saved, not rebuilt."""
        self.optimizer = optimizer

    def drop_saved_state(self, why: str) -> None:
        """Forget a loaded checkpoint's optimizer state not yet restored, with a warning."""
        if self.saved_state is not None:
            self.saved_state = None
            warn_user(f"the optimizer state of the checkpoint loaded last was not restored: "
                      f"{why}. To continue the run exactly, call controller.set_optimizer(...) "
                      "and build_optimizer() before anything else after the load")

    @property
    def rebuildable(self) -> bool:
        """True when perfora builds the optimizer (its saved state can be restored)."""
        return self.recipe is not None and not self.user_owned

    @property
    def expected(self) -> bool:
        """True when an optimizer is in use or will be built (usage tracking counts steps)."""
        return self.optimizer is not None or self.recipe is not None

    def after_restructure(self, model: nn.Module, maximize: bool) -> None:
        """Rebuild from the recipe; drop a user's optimizer (it holds replaced parameters)."""
        self.drop_saved_state("the model was restructured after the load, so it no longer "
                              "fits")
        if self.recipe is not None:
            self.build(model, maximize)
        elif self.user_owned:
            self.optimizer = self.scheduler = None
            self.awaiting_instance = True

    def keep_for_widening(self, model: nn.Module, backend: ParallelBackend) -> None:
        """Before a growth step that carries the optimizer (neurons; dendrites under
        ``dendrite_optimizer`` 'carry', or 'auto' once the network fits): keep its state by
        parameter name. Where flat shards hide the shapes (FSDP1) it is gathered whole (a
        collective), and an engine's own optimizer (DeepSpeed) is read through the backend (a
        collective under ZeRO)."""
        self.whole_carry = backend.flat_shards
        if backend.owns_optimizer:
            self.pending_carry = capture_engine(model, backend)
        elif backend.flat_shards:
            self.pending_carry = capture_whole(self.optimizer, self.scheduler, model, backend)
        else:
            self.pending_carry = capture(self.optimizer, self.scheduler, model)

    def narrow_kept(self, model: nn.Module, backend: ParallelBackend) -> None:
        """After the rewind that precedes a neuron step: cut what was kept back to the best
        model's shapes (a retried step's new neurons start at zero, not with the moments of
        the step it replaces). Sharded and engine states are kept as they are."""
        if backend.sharded or backend.owns_optimizer or backend.flat_shards:
            return
        shapes = {name: p.shape for name, p in unwrap_model(model).named_parameters()}
        self.pending_carry = narrowed(self.pending_carry, shapes)

    def carry_after_widening(self, model: nn.Module, backend: ParallelBackend) -> None:
        """After a growth step that carries the optimizer: the rebuilt one takes what was
        kept; an optimizer the user or a framework builds takes it when handed over
        (``pending_carry``), and an engine's new optimizer is written through the backend."""
        if backend.owns_optimizer:
            carried, self.pending_carry = self.pending_carry, None
            carry_engine_into(carried, model, backend)
        elif self.rebuildable:
            carried, self.pending_carry = self.pending_carry, None
            if self.whole_carry:
                carry_whole_into(carried, self.optimizer, self.scheduler, model, backend)
            else:
                carry_into(carried, self.optimizer, self.scheduler, model)
            self.mark_scheduler()  # the schedule goes on from the carried step count

    def lr(self) -> float | None:
        """The current learning rate (None without an optimizer)."""
        return current_lr(self.optimizer)

    def step_scheduler(self, score: float, maximize: bool) -> None:
        """Step the scheduler on a plain epoch (plateau schedulers get the score); warn once
        when it stepped in between as well (the loop kept its own ``scheduler.step()``)."""
        scheduler = self.scheduler
        mark, count = self.scheduler_mark, getattr(scheduler, "last_epoch", None)
        if mark is not None and mark[0] is scheduler and isinstance(count, int) \
                and count > mark[1] and not self.warned_double_step:
            self.warned_double_step = True
            warn_user(f"the LR scheduler ({type(scheduler).__name__}) was stepped "
                      f"{count - mark[1]} time(s) since perfora stepped it at the last score: "
                      "perfora steps a registered scheduler once per epoch itself (in "
                      "step() / add_validation_score), so a scheduler.step() in your loop "
                      "makes the schedule run twice as fast; remove it (a per-batch schedule "
                      "that you step yourself: keep it, and do not register it)")
        step_scheduler(scheduler, score, maximize)
        self.mark_scheduler()


PER_BATCH_SCHEDULERS = ("OneCycleLR", "CyclicLR")
"""Schedulers torch steps once per batch: registered with the controller, they are warned
about (it steps once per epoch)."""


class OptimizerMethods:
    """The controller's optimizer methods: what it registers, builds or is handed lives in
    its slot (``self._slot``)."""

    _slot: OptimizerSlot
    model: nn.Module
    config: Any
    backend: ParallelBackend

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer in use (built by perfora, yours, or a framework's)."""
        return self._slot.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        self._slot.optimizer = optimizer

    @property
    def scheduler(self) -> Any:
        """The LR scheduler in use (None without one)."""
        return self._slot.scheduler

    @scheduler.setter
    def scheduler(self, scheduler: Any) -> None:
        self._slot.scheduler = scheduler

    def set_optimizer(self, cls: type[torch.optim.Optimizer], **kwargs: Any) -> None:
        """Register the optimizer class and arguments; rebuilt after every restructure."""
        self._refuse_under_engine("set_optimizer")
        self._slot.set_recipe(cls, kwargs)

    def set_scheduler(self, cls: type, **kwargs: Any) -> None:
        """Register the LR scheduler class and arguments, stepped by the controller: built
        over the optimizer perfora builds, or over one you register with
        ``set_optimizer_instance`` (before or after this call) without a scheduler."""
        self._refuse_under_engine("set_scheduler")
        if getattr(cls, "__name__", "") in PER_BATCH_SCHEDULERS:
            warn_user(f"{cls.__name__} is stepped once per batch, but the controller steps a "
                      "registered scheduler once per epoch (a schedule planned in batches "
                      "would run epochs long, then fail past its end). Step it yourself in "
                      "the batch loop and move it onto each decision.optimizer with "
                      "perfora.move_scheduler(scheduler, decision.optimizer), or give it a "
                      "schedule counted in epochs")
        self._slot.set_scheduler(cls, kwargs)
        if self._slot.scheduler is not None:
            check_plateau_mode(self._slot.scheduler, self.config.maximize)

    def build_optimizer(self) -> tuple[torch.optim.Optimizer, Any]:
        """(Re)build optimizer and scheduler over the currently trainable parameters (under
        DeepSpeed: the engine's optimizer, and None: the engine steps its scheduler). The
        first build after a ``load`` that found no optimizer registered restores the
        checkpoint's optimizer and scheduler state into it."""
        if self.backend.owns_optimizer:
            return self._slot.optimizer, None  # type: ignore[return-value]
        built = self._slot.build(self.model, self.config.maximize)
        restore, self._slot.saved_state = self._slot.saved_state, None
        if restore is not None:  # a load came first: its saved state goes into this one
            restore()
        return built

    def _refuse_under_engine(self, what: str) -> None:
        """DeepSpeed builds the optimizer and scheduler from wrap_deepspeed's recipe."""
        if self.backend.owns_optimizer:
            raise OrderError(f"{what}() under DeepSpeed: the engine builds the optimizer and "
                             "scheduler; give their recipe to perfora.wrap_deepspeed("
                             "optimizer=..., optimizer_args=..., lr_scheduler=...) instead")

    def set_optimizer_instance(self, optimizer: torch.optim.Optimizer,
                               scheduler: Any = None) -> None:
        """Use an optimizer you built. After a restructure you must rebuild it yourself;
        after a neuron step the one you register gets the old one's moments. One over none of
        the model's parameters (another model's) is a ConfigError."""
        _check_covers_model(optimizer, self.model)
        self._slot.set_instance(optimizer, scheduler)
        if self._slot.scheduler is not None:
            check_plateau_mode(self._slot.scheduler, self.config.maximize)
        self.carry_optimizer_state(optimizer, scheduler)

    def carry_optimizer_state(self, optimizer: torch.optim.Optimizer,
                              scheduler: Any = None) -> bool:
        """After a growth step (neurons; dendrites as ``dendrite_optimizer`` says),
        give an optimizer built over the grown model (yours, or a framework's) the old
        optimizer's moments in the old slices of each parameter, zeros in the new ones, and
        the old learning rates (and ``scheduler`` the old scheduler's state, where perfora
        held one). The integrations call it; True when something was carried (nothing after
        other restructures). Under FSDP2 and FSDP1 call it on every rank."""
        carried, self._slot.pending_carry = self._slot.pending_carry, None
        if carried is None:
            return False
        if self._slot.whole_carry:
            carry_whole_into(carried, optimizer, scheduler, self.model, self.backend)
        else:
            carry_into(carried, optimizer, scheduler, self.model)
        if scheduler is not None and scheduler is self._slot.scheduler:
            self._slot.mark_scheduler()
        return bool(carried.states)

    def hand_over_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        """A framework's optimizer (Lightning, HF Trainer): read for the learning rate and
        saved in checkpoints, never rebuilt by perfora (the framework rebuilds it)."""
        self._slot.hand_over(optimizer)


def _check_covers_model(optimizer: Any, model: nn.Module) -> None:
    """An optimizer over none of the model's parameters trains another model: refused, as
    the epochs trained with it would change nothing here."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return  # set_instance says what it needs
    own = {id(p) for p in unwrap_model(model).parameters()}
    given = [p for group in optimizer.param_groups for p in group["params"]]
    if own and given and not any(id(p) in own for p in given):
        raise ConfigError("set_optimizer_instance: the optimizer holds none of this model's "
                          "parameters (built over another model, or a copy of it?); build "
                          "it over the model the controller grows, e.g. torch.optim.Adam("
                          "decision.model.parameters())")
