"""The backend of DistributedDataParallel: re-wrapped after every change of what trains.

DDP fixes the parameters it synchronizes when it is built: a dendrite added later, or a
parameter unfrozen later, is never all-reduced. So after every change perfora builds a new
wrapper around the same module with the same arguments; DDP's constructor broadcasts rank
0's values, so every rank starts the new phase from identical values.
"""

from __future__ import annotations

from .dp import DataParallelBackend


class DDPBackend(DataParallelBackend):
    """A new DDP wrapper (same arguments and comm hooks) after a restructure; the old one is
    retired, since its gradient buckets do not cover the new parameters."""

    name = "ddp"
    replaces_wrappers = True
