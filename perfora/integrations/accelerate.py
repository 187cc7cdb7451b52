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

from ..errors import OrderError
from ..growth import Decision, GrowthController
from ..nn.layers import unwrap_model
from ._common import CONTROLLER_FILE


def prepare_after_growth(accelerator: Any, decision: Decision) -> tuple[Any, Any]:
    """``accelerator.prepare`` of the grown model and the optimizer perfora rebuilt (plus its
    scheduler when one is registered); returns (model, optimizer)."""
    if decision.optimizer is None:
        raise OrderError("the decision holds no optimizer: register one with "
                         "controller.set_optimizer(cls, **kwargs) so perfora can rebuild it "
                         "over the new dendrites")
    inner = unwrap_model(decision.model)
    _forget(accelerator, inner)
    if decision.scheduler is not None:
        model, optimizer, _ = accelerator.prepare(inner, decision.optimizer, decision.scheduler)
    else:
        model, optimizer = accelerator.prepare(inner, decision.optimizer)
    return model, optimizer


def _forget(accelerator: Any, inner: torch.nn.Module) -> None:
    """Drop the accelerator's references to earlier wrappers of ``inner`` and to optimizers
    over its parameters (Accelerate has no public call for this)."""
    params = {id(p) for p in inner.parameters()}
    stale = [opt for opt in accelerator._optimizers
             if any(id(p) in params for group in getattr(opt, "optimizer", opt).param_groups
                    for p in group["params"])]
    accelerator._models[:] = [m for m in accelerator._models if unwrap_model(m) is not inner]
    accelerator._optimizers[:] = [o for o in accelerator._optimizers if o not in stale]
    accelerator._schedulers[:] = [s for s in accelerator._schedulers
                                  if getattr(s, "optimizer", None) not in stale]


def save_state(accelerator: Any, controller: GrowthController, output_dir: str | Path) -> None:
    """``accelerator.save_state(output_dir)`` plus the controller's state in the same folder."""
    accelerator.save_state(str(output_dir))
    if accelerator.is_main_process:
        controller.save(Path(output_dir) / CONTROLLER_FILE)
    accelerator.wait_for_everyone()


def load_state(accelerator: Any, controller: GrowthController,
               input_dir: str | Path) -> tuple[Any, Any, Decision]:
    """Resume a folder written by :func:`save_state`: the controller restores the structure
    (so the model has the saved dendrites), the model and optimizer are prepared again, then
    Accelerate restores weights, optimizer, RNG and data positions. Returns
    (model, optimizer, decision)."""
    path = Path(input_dir) / CONTROLLER_FILE
    if not path.is_file():
        raise OrderError(f"{input_dir} has no {CONTROLLER_FILE}: save with "
                         "perfora.integrations.accelerate.save_state")
    decision = controller.load(path)
    model, optimizer = prepare_after_growth(accelerator, decision)
    accelerator.load_state(str(input_dir))
    return model, optimizer, decision
