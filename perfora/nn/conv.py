"""Dendrites of a Conv1d/2d/3d layer: output channels of one taller conv weight, neurons on
axis 1; grouped convs keep each group's rows together, every padding mode is supported."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .kernels import MixSpec
from .row_bank import RowBankLayer

# the conv's settings that model code reads from the layer it calls (e.g. transformers'
# MobileNetV2 pads by ``layer.stride``): the wrapped layer answers with the conv's own
_CONV_SETTINGS = frozenset({"in_channels", "out_channels", "kernel_size", "stride", "padding",
                            "dilation", "groups", "padding_mode", "transposed",
                            "output_padding"})


class ConvDendriticLayer(RowBankLayer):
    """A wrapped ``nn.Conv1d``/``Conv2d``/``Conv3d`` with its dendrite bank."""

    kind = "conv"

    def __getattr__(self, name: str):
        if name in _CONV_SETTINGS:
            return getattr(self.source, name)
        return super().__getattr__(name)

    def _groups(self) -> int:
        return int(self.source.groups)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if self.num_dendrites and not self.grouped \
                and x.dim() == len(self.source.kernel_size) + 1:
            # an unbatched input (C, *spatial) puts the neurons on axis 0: run it as a
            # batch of one, as the conv itself does
            return super().forward(x.unsqueeze(0), *args, **kwargs).squeeze(0)
        return super().forward(x, *args, **kwargs)

    def _dendrite_call(self, x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
        return self.source._conv_forward(x, weight, bias)

    def _fused_layout(self, x: torch.Tensor, y: torch.Tensor) -> MixSpec | None:
        """The fused node runs zero-padded convs of batched inputs, channels on axis 1."""
        src = self.source
        if src.padding_mode != "zeros" or isinstance(src.padding, str) \
                or x.dim() != src.weight.dim() or self.neuron_axis % y.ndim != 1:
            return None
        conv = (tuple(src.stride), tuple(src.padding), tuple(src.dilation))
        return MixSpec(self.kind, self.activation, conv)

    def _fused_conv_forward(self) -> Callable:
        return self.source._conv_forward
