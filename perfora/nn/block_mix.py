"""The dendrite mix of a widened layer, block by block, so widening changes no output bit.

The bank's matrix products already run per block (:class:`perfora.nn.blocks.BlockedLayer`),
but the mix after them is elementwise (the activation, ``addcmul``): on a wider tensor an old
neuron's element sits in another vector lane or in the scalar tail, whose rounding may
differ (sigmoid's does on some CPUs). Each block of neurons is therefore mixed apart, on
contiguous copies of the narrow layer's shapes, and the blocks joined.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .blocks import BlockedLayer, block_of, joined

MixPre = Callable[[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor | None,
                   list[int]], tuple[torch.Tensor, list[torch.Tensor]]]


def mix_from_pre(act: Callable[[torch.Tensor], torch.Tensor], pre: list[torch.Tensor],
                 y: torch.Tensor, v_rows: torch.Tensor, cascade: torch.Tensor | None,
                 shape: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """y + sum_k v[k] * act(pre_k + cascade terms), in autograd ops, and each dendrite's
    activation (``v_rows``, ``cascade``: the rows in use, viewed in the neuron ``shape``)."""
    k = len(pre)
    if k == 1:  # no cascade: y + v * act(D(x)) in two kernels
        d = act(pre[0])
        return torch.addcmul(y, v_rows.view(shape), d), [d]
    v = v_rows.view(k, *shape).unbind(0)
    w = cascade.view(-1, *shape).unbind(0) if cascade is not None else ()
    dendrites: list[torch.Tensor] = []
    out, row = y, 0
    for i, a in enumerate(pre):
        for j in range(i):
            a = torch.addcmul(a, w[row], dendrites[j])
            row += 1
        d = act(a)
        dendrites.append(d)
        out = torch.addcmul(out, v[i], d)
    return out, dendrites


def widened_blocks(source: nn.Module) -> list[int] | None:
    """The output blocks of a layer that gained neurons (its widths at each widening), else
    None."""
    if isinstance(source, BlockedLayer) and source.blocked():
        outs = source.blocks()[0]
        return outs if len(outs) > 1 else None
    return None


def mix_by_blocks(mix: MixPre, pre: list[torch.Tensor], y: torch.Tensor, v_rows: torch.Tensor,
                  cascade: torch.Tensor | None, axis: int, blocks: list[int], shape: list[int]
                  ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``mix`` on each block of neurons apart (``axis``: the neuron axis of ``y``), joined:
    the output and each dendrite's activation, whole."""
    outs, dendrites = [], []
    start = 0
    neurons = v_rows.shape[-1]
    for length in blocks:
        part = list(shape)
        part[axis] = length
        out, ds = mix([block_of(p, axis, start, length) for p in pre],
                      block_of(y, axis, start, length),
                      v_rows.reshape(-1, neurons).narrow(1, start, length).contiguous(),
                      None if cascade is None else
                      cascade.reshape(-1, neurons).narrow(1, start, length).contiguous(),
                      part)
        outs.append(out)
        dendrites.append(ds)
        start += length
    joined_ds = [joined([ds[i] for ds in dendrites], axis, y) for i in range(len(pre))]
    return joined(outs, axis, y), joined_ds
