"""Which model object trains: a wrapper reported to ``step()`` checked against the current one.

After a restructure the controller re-wraps DDP; the replaced wrapper is retired (its
gradient buckets miss the new dendrites), so reporting it again is refused.
"""

from __future__ import annotations

from collections.abc import Container

from torch import nn

from ..errors import OrderError
from ..nn.layers import unwrap_model


def check_reported_model(current: nn.Module, model: nn.Module,
                         retired: Container[nn.Module]) -> None:
    """OrderError unless ``model`` wraps the controller's module and is not retired."""
    if unwrap_model(model) is not unwrap_model(current):
        raise OrderError("step() got a different model from the one this controller was "
                         "created with; pass the same model (or its DDP/DataParallel "
                         "wrapper)")
    if model in retired:
        raise OrderError("step() got a DistributedDataParallel wrapper (or DeepSpeed engine) "
                         "that perfora replaced at an earlier restructure: its gradient "
                         "buckets (or partitions) do not cover the new dendrites, so the ranks "
                         "may have diverged. After "
                         "every decision with restructured=True (or complete=True) use "
                         "decision.model and decision.optimizer")
