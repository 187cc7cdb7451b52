"""Rank queries and collectives; every function is a no-op in a single process."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """True inside an initialized process group with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's global rank (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """Number of ranks (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_rank_zero() -> bool:
    """Only rank 0 writes files and prints progress."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (no-op in one process)."""
    if is_distributed():
        dist.barrier()


def _reduce_device() -> torch.device:
    backend = dist.get_backend()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree_on_scores(values: Sequence[float | None], weight: float = 1.0) -> list[float | None]:
    """Weighted mean of each value over ranks, so every rank takes the same decision.

    A value that is None on every rank stays None; None on some ranks only is an error
    (ranks must report the same kinds of scores).
    """
    if not is_distributed():
        return list(values)
    n = len(values)
    packed = torch.zeros(2 * n + 1, dtype=torch.float64)
    for i, v in enumerate(values):
        if v is not None:
            packed[i] = float(v) * weight
            packed[n + i] = 1.0
    packed[2 * n] = weight
    packed = packed.to(_reduce_device())
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    packed = packed.cpu()
    total_weight = packed[2 * n].item()
    ranks = world_size()
    out: list[float | None] = []
    for i in range(n):
        present = packed[n + i].item()
        if present == 0:
            out.append(None)
        elif round(present) != ranks:
            raise ValueError("some ranks reported a score that others did not (e.g. a test "
                             "score on rank 0 only); report the same scores on every rank")
        else:
            out.append(packed[i].item() / total_weight)
    return out


def all_reduce_values(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """A copy of ``t`` reduced over ranks ('sum', 'min', 'max'), on ``t``'s device; ``t``
    itself when not distributed. Works under gloo and NCCL (moves through the GPU there)."""
    if not is_distributed():
        return t
    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    out = t.detach().to(_reduce_device(), copy=True)
    dist.all_reduce(out, op=ops[op])
    return out.to(t.device)


def rank_zero_decides(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank (a collective; ``flag`` itself when not distributed):
    for choices every rank must make alike that only rank 0 should make, e.g. by its clock."""
    if not is_distributed():
        return flag
    mine = torch.tensor([1.0 if flag and is_rank_zero() else 0.0])
    return bool(all_reduce_values(mine, "max").item() > 0)
