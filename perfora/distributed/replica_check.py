"""Check, at each report, that replicated ranks still hold the same weights.

Under DDP every rank's parameters stay bit-identical. A loop that trains through a wrapper
the controller does not know (its own ``DistributedDataParallel`` around the bare module, not
rebuilt after a growth) trains the new parameters on each rank apart: the ranks drift with no
error. A checksum of each parameter's first elements, reduced over the ranks (one small
all-reduce per report), shows it.
"""

from __future__ import annotations

import torch
from torch import nn

from ..nn.layers import unwrap_model
from .collectives import all_reduce_values

_SAMPLE = 256  # elements summed per parameter: enough to see two ranks train apart


def drifted_parameters(model: nn.Module) -> list[str]:
    """Names of the parameters whose values differ between ranks (a collective: every rank
    calls it); the same list on every rank."""
    named = [(name, p) for name, p in unwrap_model(model).named_parameters()
             if type(p.data) is torch.Tensor and p.numel()]
    if not named:
        return []
    sums = torch.stack([p.detach().reshape(-1)[:_SAMPLE].double().sum() for _, p in named])
    both = all_reduce_values(torch.cat([sums, -sums]).cpu(), "max")
    highest, lowest = both[:len(named)], -both[len(named):]
    return [name for (name, _), differ in zip(named, (highest != lowest).tolist(),
                                              strict=True) if differ]
