"""Dendrites of a Linear layer: rows of one taller weight, neurons on the last axis."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .kernels import MixSpec
from .row_bank import RowBankLayer


class LinearDendriticLayer(RowBankLayer):
    """A wrapped ``nn.Linear`` (or subclass) with its dendrite bank; any leading dimensions."""

    kind = "linear"

    def __getattr__(self, name: str):
        if name in ("in_features", "out_features"):  # model code that reads the layer's size
            return getattr(self.source, name)
        return super().__getattr__(name)

    def _dendrite_call(self, x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def _fused_layout(self, x: torch.Tensor, y: torch.Tensor) -> MixSpec | None:
        """The fused node reads the neurons on the output's last axis."""
        if self.neuron_axis % y.ndim != y.ndim - 1 or x.dim() < 1:
            return None
        return MixSpec(self.kind, self.activation, None)
