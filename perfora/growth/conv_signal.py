"""GradMax's matrix for a convolution that gains channels.

A new output channel of a conv ``P`` with incoming kernel ``w`` (flattened, ``D = in_channels
* prod(kernel)`` entries) makes the map ``h = conv(x, w)``; its reader ``C`` gains zero
weights ``v`` for it. Linearised through the modules between (elementwise ones and
BatchNorm as the identity, pooling as average pooling), the loss gradient on ``v`` is
``M w`` for a matrix ``M`` of ``R`` rows (a conv reader: ``out_channels * prod(kernel)``; a
Linear after a flatten: ``out_features`` times the flattened positions). GradMax takes ``w``
along ``M``'s top right singular vectors, as for a Linear. ``M`` is computed with torch's own
ops: the producer's patches as a conv with an identity kernel, then the reader's
weight gradient over them (``torch.nn.grad``) or, for a Linear, a product with its output
gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.blocks import CONV_TYPES, Blockwise
from ..nn.layers import DendriticLayer
from ..nn.plan_types import DROPOUT, ELEMENTWISE, POOLING, LayerPlan

PATCH_LIMIT = 1 << 24
"""Most patch values (samples x D x positions) one pass computes: larger batches are cut to
their first samples, so the signal's cost stays bounded on big layers."""

_WEIGHT_GRAD = {1: torch.nn.grad.conv1d_weight, 2: torch.nn.grad.conv2d_weight,
                3: torch.nn.grad.conv3d_weight}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_ADAPTIVE_AVG = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}


def core_layer(module: nn.Module) -> nn.Module:
    """The plain layer inside a dendritic one (the module itself otherwise)."""
    return module.source if isinstance(module, DendriticLayer) else module


def _dims(conv: nn.Module) -> int:
    return len(conv.kernel_size)


def _padding(conv: nn.Module) -> tuple[int, ...] | None:
    """Numeric padding of a zero-padded conv (None where torch.nn.grad cannot take it)."""
    if conv.padding_mode != "zeros":
        return None
    if conv.padding == "valid":
        return (0,) * _dims(conv)
    if conv.padding == "same":
        total = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size, strict=True)]
        return None if any(t % 2 for t in total) else tuple(t // 2 for t in total)
    return tuple(conv.padding)


def _pool_surrogate(pool: nn.Module, dims: int
                    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The linear stand-in for a pooling module (max pooling as average pooling of its
    windows), or None when it has none here."""
    name = type(pool).__name__
    if name.startswith(("AvgPool", "AdaptiveAvgPool")):
        return pool
    if name.startswith("AdaptiveMaxPool"):
        return lambda h: _ADAPTIVE_AVG[dims](h, pool.output_size)
    if name.startswith("MaxPool"):
        dilation = pool.dilation if isinstance(pool.dilation, tuple) else (pool.dilation,)
        if any(d != 1 for d in dilation):
            return None
        return lambda h: _AVG[dims](h, pool.kernel_size, pool.stride, pool.padding,
                                    ceil_mode=pool.ceil_mode)
    return None


@dataclass
class ConvPair:
    """A conv producer and its one reader, with the pooling between: how to compute ``M``."""

    producer: nn.Module
    reader: nn.Module
    repeat: int
    pools: list[Callable[[torch.Tensor], torch.Tensor]]

    @property
    def width(self) -> int:
        """D: the entries of one incoming kernel."""
        return int(self.producer.in_channels * math.prod(self.producer.kernel_size))

    def shape(self) -> tuple[int, int]:
        """(R, D) of ``M``."""
        if isinstance(self.reader, nn.Linear):
            return int(self.reader.out_features) * self.repeat, self.width
        return int(self.reader.out_channels * math.prod(self.reader.kernel_size)), self.width

    def matrix(self, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, int] | None:
        """``M`` summed over the samples of one pass (float32), and how many samples it
        used; None when the shapes do not fit (a reshaped batch, a changed layer)."""
        p, dims = self.producer, _dims(self.producer)
        if x.dim() != dims + 2 or g.shape[0] != x.shape[0] or x.shape[1] != p.in_channels:
            return None
        spatial = max(1, math.prod(x.shape[2:]))
        n = max(1, min(x.shape[0], PATCH_LIMIT // (self.width * spatial)))
        x, g = x[:n].float(), g[:n].float()
        eye = torch.eye(self.width, device=x.device).reshape(
            self.width, p.in_channels, *p.kernel_size)
        h = _CONV[dims](x, eye, None, p.stride, _padding(p), p.dilation)  # [n, D, *space]
        for pool in self.pools:
            h = pool(h)
        if isinstance(self.reader, nn.Linear):
            h = h.reshape(n, self.width, -1)
            if g.dim() != 2 or h.shape[2] != self.repeat:
                return None
            return torch.einsum("bo,bds->osd", g, h).reshape(-1, self.width), n
        c = self.reader
        if g.dim() != dims + 2 or g.shape[1] != c.out_channels:
            return None
        try:
            grad = _WEIGHT_GRAD[dims](h, (c.out_channels, self.width, *c.kernel_size), g,
                                      c.stride, _padding(c), c.dilation)  # [O, D, *k]
        except RuntimeError:  # the maps do not line up (a layout this estimate cannot follow)
            return None
        return grad.movedim(1, -1).reshape(-1, self.width), n


def conv_pair(root: nn.Module, entry: LayerPlan) -> ConvPair | None:
    """The :class:`ConvPair` of a plan entry whose producer is a zero-padded, ungrouped conv
    read by one ungrouped conv of the same kind or one Linear (after a flatten), through
    elementwise modules, dropout, BatchNorm and pooling only; None otherwise (random rows)."""
    if not entry.widenable or entry.partners or entry.chunks > 1 \
            or len(entry.consumers) != 1:
        return None
    producer = core_layer(root.get_submodule(entry.path))
    reader_path, repeat = entry.consumers[0]
    reader = core_layer(root.get_submodule(reader_path))
    if not isinstance(producer, CONV_TYPES) or producer.groups != 1 \
            or _padding(producer) is None:
        return None
    dims = _dims(producer)
    if isinstance(reader, CONV_TYPES):
        if type(reader) is not type(producer) or reader.groups != 1 or repeat != 1 \
                or _padding(reader) is None:
            return None
    elif not isinstance(reader, nn.Linear):
        return None
    pools = []
    for path, _axis in entry.through:
        try:
            module = root.get_submodule(path)
        except AttributeError:
            return None  # a function found by torch.fx: not looked into here
        if isinstance(module, Blockwise):  # a module between that an earlier step widened
            module = module.fn
        if isinstance(module, POOLING):
            surrogate = _pool_surrogate(module, dims)
            if surrogate is None:
                return None
            pools.append(surrogate)
        elif not isinstance(module, ELEMENTWISE + DROPOUT + (nn.modules.batchnorm._BatchNorm,)):
            return None
    return ConvPair(producer, reader, repeat, pools)
