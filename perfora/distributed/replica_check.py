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
_BUCKETS = 64  # parameter i is summed into bucket i % 64: one fixed-size all-reduce


def drifted_parameters(model: nn.Module) -> list[str]:
    """Names of the parameters whose values differ between ranks (a collective: every rank
    calls it), the same on every rank; empty where the ranks' parameter counts differ (the
    structure check at the next restructure names that)."""
    named = [(name, p) for name, p in unwrap_model(model).named_parameters()
             if type(p.data) is torch.Tensor and p.numel()]
    sums = torch.zeros(1 + _BUCKETS, dtype=torch.float64)
    sums[0] = len(named)
    sampled = torch.zeros(len(named), dtype=torch.float64)
    on_device: dict[torch.device, list[int]] = {}
    for i, (_, p) in enumerate(named):
        on_device.setdefault(p.device, []).append(i)
    for rows in on_device.values():  # one copy to the host per device, not per parameter
        sampled[rows] = torch.stack([named[i][1].detach().reshape(-1)[:_SAMPLE].double().sum()
                                     for i in rows]).cpu()
    for i, value in enumerate(sampled.tolist()):  # in order: the same sums on every rank
        sums[1 + i % _BUCKETS] += value
    both = all_reduce_values(torch.cat([sums, -sums]), "max")
    highest, lowest = both[:1 + _BUCKETS], -both[1 + _BUCKETS:]
    if highest[0] != lowest[0]:
        return []
    differ = (highest[1:] != lowest[1:]).tolist()
    return [name for i, (name, _) in enumerate(named) if differ[i % _BUCKETS]]
