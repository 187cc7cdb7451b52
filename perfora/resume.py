"""Resume a run from a checkpoint onto a freshly built model (converted or not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .checkpoint import load_checkpoint
from .config import PerforaConfig
from .controller import GrowthController
from .convert import rebuild_structure
from .errors import CheckpointError, ConversionError


def resume(model: nn.Module, path: str | Path, *, optimizer: type | None = None,
           optimizer_args: dict[str, Any] | None = None, scheduler: type | None = None,
           scheduler_args: dict[str, Any] | None = None, run_dir: str | Path | None = None,
           **settings: Any) -> GrowthController:
    """A controller that continues the run saved in ``path`` exactly.

    ``model`` is built the same way as in the saved run; it may be unconverted (perfora wraps
    the same layers) or already perforated. The settings come from the checkpoint
    (``settings`` override them); give the same optimizer/scheduler classes and arguments
    so their saved state is restored. ``run_dir`` defaults to the checkpoint's folder.
    """
    path = Path(path)
    meta = load_checkpoint(path).meta
    if "controller" not in meta or "config" not in meta:
        raise CheckpointError(f"{path} holds no controller state; use perfora.load_model() "
                              "to load weights only")
    try:
        rebuild_structure(model, meta["structure"])
    except ConversionError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    config = PerforaConfig.from_dict({**meta["config"], **settings})
    controller = GrowthController(model, config,
                                  run_dir=run_dir if run_dir is not None else path.parent)
    if optimizer is not None:
        controller.set_optimizer(optimizer, **(optimizer_args or {}))
    if scheduler is not None:
        controller.set_scheduler(scheduler, **(scheduler_args or {}))
    controller.load(path)
    return controller
