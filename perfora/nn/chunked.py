"""The output order of a widened layer whose forward is cut into equal chunks.

Phi-3's ``gate_up_proj`` and ModernBERT's ``Wi`` compute the gate and the up projection of a
gated MLP as one layer whose output the block cuts in halves (``chunk(2, dim=-1)``). A neuron
of such a block is one row in each half, so a widening would have to insert rows in the middle
of the weight. Instead the rows are appended as for any layer (the weight holds
``[gate, up]`` of each widening's block one after the other: the *stored* order, which the
optimizer carry, the rewind and the dendrite banks all keep), and the layer's output is put
in *forward* order (every block's first chunk, then every block's second) at the end of its
forward pass. Splits and concatenations copy values, so no output changes a bit.

The layer's core (the Linear) holds ``out_chunks``; its ``out_blocks`` say where each
widening's block starts. :func:`forward_index` gives the permutation that ``perfora.export``
bakes into the plain layer's rows.
"""

from __future__ import annotations

import torch
from torch import nn


def chunk_count(core: nn.Module) -> int:
    """How many equal chunks the layer's output is cut into by the block that reads it."""
    return int(getattr(core, "out_chunks", 1) or 1)


def _parts(core: nn.Module) -> list[int] | None:
    """Each out block's size, or None when the output needs no reordering."""
    blocks = getattr(core, "out_blocks", None)
    if chunk_count(core) == 1 or not blocks or len(blocks) < 2:
        return None
    return [int(b) for b in blocks]


def forward_order(core: nn.Module, y: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """``y`` (stored order along ``axis``) in the order the block reads: every widening
    block's first chunk, then every block's second, ..."""
    blocks = _parts(core)
    if blocks is None:
        return y
    c = chunk_count(core)
    pieces = [p.chunk(c, dim=axis) for p in y.split(blocks, dim=axis)]
    return torch.cat([piece[i] for i in range(c) for piece in pieces], dim=axis)


def stored_order(core: nn.Module, y: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """The inverse of :func:`forward_order`: ``y`` back in the weight's row order."""
    blocks = _parts(core)
    if blocks is None:
        return y
    c = chunk_count(core)
    parts = y.split([b // c for _ in range(c) for b in blocks], dim=axis)
    n = len(blocks)
    return torch.cat([parts[i * n + j] for j in range(n) for i in range(c)], dim=axis)


def forward_index(core: nn.Module) -> torch.Tensor | None:
    """The stored row of each output in forward order (None when the order is the rows')."""
    blocks = _parts(core)
    if blocks is None:
        return None
    return forward_order(core, torch.arange(sum(blocks)))
