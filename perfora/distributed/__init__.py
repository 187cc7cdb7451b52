"""Rank primitives for a script that runs alone or under torchrun: rank queries, collectives
that are no-ops in one process, structure fingerprints to check that ranks agree, and small
helpers (joining the process group, ``set_epoch``, ``print0``).

The wrappers (DDP, FSDP, DeepSpeed) are backends and live in :mod:`perfora.parallel`; the
common ones are also importable from ``perfora`` itself.
"""

from .collectives import (
    agree_on_scores,
    all_reduce_values,
    barrier,
    is_distributed,
    is_rank_zero,
    rank,
    world_size,
)
from .fingerprint import RankMismatchError, check_same_structure, structure_fingerprint
from .helpers import init_from_env, print0, set_epoch

__all__ = ["agree_on_scores", "all_reduce_values", "barrier", "is_distributed", "is_rank_zero",
           "rank", "world_size", "RankMismatchError", "check_same_structure",
           "structure_fingerprint", "init_from_env", "print0", "set_epoch"]
