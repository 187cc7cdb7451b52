"""Small helpers for a training script that runs alone or under torchrun unchanged."""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .collectives import is_rank_zero
from .exit_settle import settle_at_exit


def init_from_env(backend: str | None = None, timeout_s: float = 600.0) -> tuple[int, int, int]:
    """Join the process group torchrun/SLURM describes; (rank, world_size, local_rank).

    Without ``WORLD_SIZE`` in the environment (a plain ``python train.py``) nothing is
    initialized and (0, 1, 0) is returned. ``backend`` defaults to nccl with CUDA, else gloo.
    Under SLURM without torchrun, ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID`` are read
    (``MASTER_ADDR``/``MASTER_PORT`` must be exported by the job script).
    """
    env = os.environ
    if "WORLD_SIZE" not in env and "SLURM_NTASKS" in env and "MASTER_ADDR" in env:
        env.setdefault("WORLD_SIZE", env["SLURM_NTASKS"])
        env.setdefault("RANK", env["SLURM_PROCID"])
        env.setdefault("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
    if "WORLD_SIZE" not in env:
        return 0, 1, 0
    if not dist.is_initialized():
        if backend is None:
            import torch

            backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    settle_at_exit()
    return dist.get_rank(), dist.get_world_size(), int(env.get("LOCAL_RANK", 0))


def set_epoch(loaders: Any | Iterable[Any], epoch: int) -> int:
    """Call ``set_epoch(epoch)`` on the sampler of each DataLoader (or sampler) given.

    A ``DistributedSampler`` shuffles the same way every epoch unless told the epoch, so call
    this at the start of every epoch. Returns how many samplers were set.
    """
    items = loaders if isinstance(loaders, list | tuple) else [loaders]
    count = 0
    for item in items:
        seen: set[int] = set()
        for obj in (item, getattr(item, "sampler", None),
                    getattr(getattr(item, "batch_sampler", None), "sampler", None)):
            if obj is not None and id(obj) not in seen and callable(getattr(obj, "set_epoch",
                                                                             None)):
                seen.add(id(obj))
                obj.set_epoch(epoch)
                count += 1
    return count


def print0(*args: Any, **kwargs: Any) -> None:
    """print() on rank 0 only (every rank may call it)."""
    if is_rank_zero():
        print(*args, **kwargs)
