"""Resume a run from a checkpoint onto a freshly built model (converted or not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .controller import GrowthController


def resume(model: nn.Module | str | Path, path: str | Path | nn.Module, *,
           optimizer: type | None = None, optimizer_args: dict[str, Any] | None = None,
           scheduler: type | None = None, scheduler_args: dict[str, Any] | None = None,
           run_dir: str | Path | None = None, **settings: Any) -> GrowthController:
    """A controller that continues the run saved in ``path`` exactly.

    ``model`` is built the same way as in the saved run; it may be unconverted (perfora wraps
    the same layers) or already perforated. The settings come from the checkpoint
    (``settings`` override them); give the same optimizer/scheduler classes and arguments
    so their saved state is restored. ``run_dir`` defaults to the checkpoint's folder.
    The file is checked and the whole load rehearsed on a weightless copy of ``model``
    first: a file that is corrupt or does not fit raises CheckpointError with ``model``
    unchanged. Same as :meth:`GrowthController.from_checkpoint`. The model and the path may
    come in either order.
    """
    return GrowthController.from_checkpoint(
        path, model, optimizer=optimizer, optimizer_args=optimizer_args, scheduler=scheduler,
        scheduler_args=scheduler_args, run_dir=run_dir, **settings)
