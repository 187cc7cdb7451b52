"""The backend of a bare module in one process (or one per rank without a wrapper)."""

from __future__ import annotations

from .base import ReplicatedBackend


class NoWrapperBackend(ReplicatedBackend):
    """A bare module: nothing to re-wrap, the structure still checked over ranks."""

    name = "none"
