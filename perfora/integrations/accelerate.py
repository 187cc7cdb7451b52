"""Growth in a Hugging Face Accelerate loop: prepare the grown model and new optimizer again.

``accelerator.prepare`` wraps the model (for example in DistributedDataParallel, whose
gradient buckets cover the parameters of that moment) and the optimizer. After a
restructure the dendrites are new parameters, so::

    decision = ctl.step(val_loss)
    if decision.restructured:
        model, optimizer = prepare_after_growth(accelerator, decision)

The accelerator forgets the replaced model and optimizer, so ``accelerator.save_state``
keeps saving one of each. :func:`save_state` / :func:`load_state` add the controller's
state (structure, scores, best model) to Accelerate's checkpoint folder, so a run resumes
with its dendrites.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, OrderError
from ..growth import Decision, GrowthController
from ..growth.scheduler_move import move_scheduler
from ..nn.layers import unwrap_model
from ._common import CONTROLLER_FILE


def prepare_after_growth(accelerator: Any, decision: Decision,
                         scheduler: Any = None) -> tuple[Any, ...]:
    """``accelerator.prepare`` of the grown model and the optimizer perfora rebuilt (plus its
    scheduler when one is registered); returns (model, optimizer).

    ``scheduler``: an LR scheduler you step yourself (a per-batch warm-up, prepared or not).
    It is moved onto the new optimizer where its schedule had reached
    (:func:`perfora.move_scheduler`) and prepared again; then the return is
    (model, optimizer, scheduler)."""
    if decision.optimizer is None:
        raise OrderError("the decision holds no optimizer: register one with "
                         "controller.set_optimizer(cls, **kwargs) so perfora can rebuild it "
                         "over the new dendrites")
    if scheduler is not None and decision.scheduler is not None:
        raise ConfigError("a scheduler is registered with the controller (set_scheduler) and "
                          "another given to prepare_after_growth: perfora steps the registered "
                          "one, so give only the one you step yourself")
    inner = unwrap_model(decision.model)
    own = getattr(scheduler, "scheduler", scheduler)  # an AcceleratedScheduler's own
    _forget(accelerator, inner, own)
    if scheduler is not None:
        move_scheduler(own, decision.optimizer)
        return tuple(accelerator.prepare(inner, decision.optimizer, own))
    if decision.scheduler is not None:
        model, optimizer, _ = accelerator.prepare(inner, decision.optimizer, decision.scheduler)
    else:
        model, optimizer = accelerator.prepare(inner, decision.optimizer)
    return model, optimizer


def _forget(accelerator: Any, inner: torch.nn.Module, scheduler: Any = None) -> None:
    """Drop the accelerator's references to earlier wrappers of ``inner``, to optimizers
    over its parameters and to their schedulers (and to ``scheduler``'s wrapper), as
    Accelerate has no public call for this."""
    params = {id(p) for p in inner.parameters()}
    stale = [opt for opt in accelerator._optimizers
             if any(id(p) in params for group in getattr(opt, "optimizer", opt).param_groups
                    for p in group["params"])]
    stale_inner = {id(getattr(opt, "optimizer", opt)) for opt in stale}
    accelerator._models[:] = [m for m in accelerator._models if unwrap_model(m) is not inner]
    accelerator._optimizers[:] = [o for o in accelerator._optimizers if o not in stale]
    accelerator._schedulers[:] = [
        s for s in accelerator._schedulers
        if getattr(s, "scheduler", s) is not scheduler
        and id(_scheduler_optimizer(s)) not in stale_inner]


def _scheduler_optimizer(scheduler: Any) -> Any:
    """The torch optimizer under a (prepared) scheduler."""
    optimizer = getattr(getattr(scheduler, "scheduler", scheduler), "optimizer", None)
    return getattr(optimizer, "optimizer", optimizer)


def save_state(accelerator: Any, controller: GrowthController, output_dir: str | Path) -> None:
    """``accelerator.save_state(output_dir)`` plus the controller's state in the same folder."""
    accelerator.save_state(str(output_dir))
    if accelerator.is_main_process:
        controller.save(Path(output_dir) / CONTROLLER_FILE)
    accelerator.wait_for_everyone()


def load_state(accelerator: Any, controller: GrowthController, input_dir: str | Path,
               scheduler: Any = None) -> tuple[Any, ...]:
    """Resume a folder written by :func:`save_state`: the controller restores the structure
    (so the model has the saved dendrites), the model and optimizer are prepared again, then
    Accelerate restores weights, optimizer, RNG and data positions. Returns
    (model, optimizer, decision); with ``scheduler`` (one you step yourself, built over the
    optimizer before the load) it is moved onto the new optimizer, prepared and restored too,
    and the return is (model, optimizer, scheduler, decision)."""
    path = Path(input_dir) / CONTROLLER_FILE
    if not path.is_file():
        raise OrderError(f"{input_dir} has no {CONTROLLER_FILE}: save with "
                         "perfora.integrations.accelerate.save_state")
    decision = controller.load(path)
    prepared = prepare_after_growth(accelerator, decision, scheduler)
    accelerator.load_state(str(input_dir))
    return (*prepared, decision)
