"""Distributed support: rank queries and the few collectives the controller needs."""

from .collectives import (
    agree_on_scores,
    barrier,
    is_distributed,
    is_rank_zero,
    rank,
    world_size,
)

__all__ = ["agree_on_scores", "barrier", "is_distributed",
           "is_rank_zero", "rank", "world_size"]
