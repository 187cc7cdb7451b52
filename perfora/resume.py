"""Resume a run from a checkpoint onto a freshly built model (converted or not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .checkpoint import fit_structure, load_checkpoint
from .config import PerforaConfig
from .errors import CheckpointError, ConfigError
from .growth.controller import GrowthController, rehearse_checkpoint
from .optim import OptimizerRecipe, SchedulerRecipe


def resume(model: nn.Module, path: str | Path, *, optimizer: type | None = None,
           optimizer_args: dict[str, Any] | None = None, scheduler: type | None = None,
           scheduler_args: dict[str, Any] | None = None, run_dir: str | Path | None = None,
           **settings: Any) -> GrowthController:
    """A controller that continues the run saved in ``path`` exactly.

    ``model`` is built the same way as in the saved run; it may be unconverted (perfora wraps
    the same layers) or already perforated. The settings come from the checkpoint
    (``settings`` override them); give the same optimizer/scheduler classes and arguments
    so their saved state is restored. ``run_dir`` defaults to the checkpoint's folder.
    The file is checked and the whole load rehearsed on a weightless copy of ``model``
    first: a file that is corrupt or does not fit raises CheckpointError with ``model``
    unchanged.
    """
    path = Path(path)
    ckpt = load_checkpoint(path)
    meta = ckpt.meta
    if "controller" not in meta or "config" not in meta:
        raise CheckpointError(f"{path} holds no controller state; use perfora.load_model() "
                              "to load weights only")
    if "structure" not in meta:
        raise CheckpointError(f"{path}: structure: missing")
    try:
        PerforaConfig.from_dict(meta["config"])
    except ConfigError as exc:
        raise CheckpointError(f"{path}: config: {exc}") from exc
    config = PerforaConfig.from_dict({**meta["config"], **settings})
    opt_recipe = OptimizerRecipe(optimizer, dict(optimizer_args or {})) if optimizer else None
    sched_recipe = SchedulerRecipe(scheduler, dict(scheduler_args or {})) if scheduler else None
    # everything below is rehearsed on a weightless copy first: a file that does not fit
    # raises here, before the model is converted or resized
    rehearse_checkpoint(model, ckpt, str(path), config, opt_recipe, sched_recipe,
                        activation=config.activation)
    fit_structure(model, meta["structure"], str(path))
    controller = GrowthController(model, config,
                                  run_dir=run_dir if run_dir is not None else path.parent)
    if optimizer is not None:
        controller.set_optimizer(optimizer, **(optimizer_args or {}))
    if scheduler is not None:
        controller.set_scheduler(scheduler, **(scheduler_args or {}))
    controller._load_checkpoint(ckpt, path, rehearsed=True)
    return controller
