"""The backend of ``nn.DataParallel``: a new wrapper, same arguments, after a restructure."""

from __future__ import annotations

from torch import nn

from ..distributed.fingerprint import check_same_structure
from ..nn.layers import unwrap_model
from .base import ReplicatedBackend
from .wrappers import WrapperSpec


class DataParallelBackend(ReplicatedBackend):
    """DataParallel replicates the module each forward; re-wrapped to keep its arguments."""

    name = "dp"

    def __init__(self, spec: WrapperSpec) -> None:
        self.spec = spec

    @property
    def kwargs(self) -> dict:
        """The wrapper's arguments, used again at every re-wrap."""
        return self.spec.kwargs

    def rewrap(self, model: nn.Module) -> nn.Module:
        """A new DataParallel around the (restructured) inner module."""
        check_same_structure(model)
        return self.spec.wrap(unwrap_model(model))
