"""The one place a checkpoint's format is chosen: a ``.safetensors`` file or a DCP folder.

Reading, the path says it (a folder or a ``.dcp`` name is DCP). Writing, a ``.dcp`` or
``.safetensors`` name says it, any other name (and the run folder's checkpoints) follows the
``checkpoint_format`` setting: DCP needs more than one rank; ``auto`` picks it for sharded
models only.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from ..checkpoint.dcp import DCP_SUFFIX, is_dcp_path
from ..distributed.collectives import is_distributed
from ..parallel.base import ParallelBackend
from .dcp_checkpointer import DcpCheckpointer
from .file_checkpointer import FILE_SUFFIX, FileCheckpointer
from .saved_run import Checkpointer

FILE, DCP = FileCheckpointer.format, DcpCheckpointer.format


def checkpointer_for(path: str | os.PathLike | None = None, setting: str | None = None,
                     backend: ParallelBackend | None = None) -> Checkpointer:
    """The checkpointer that reads ``path`` (no ``setting``), or that writes ``path`` (or,
    without one, the run folder's checkpoints) under the ``checkpoint_format`` ``setting``
    with ``backend``."""
    if setting is None:
        if path is None:
            raise ValueError("checkpointer_for needs a path to read, or a setting to write")
        return DcpCheckpointer() if is_dcp_path(path) else FileCheckpointer()
    if backend is None:
        raise ValueError("checkpointer_for needs the backend to write under a setting")
    suffix = Path(path).suffix if path is not None else ""
    if suffix == DCP_SUFFIX or (suffix != FILE_SUFFIX
                                and resolve_format(setting, backend) == DCP):
        return DcpCheckpointer()
    return FileCheckpointer()


def resolve_format(setting: str, backend: ParallelBackend) -> str:
    """'file' or 'dcp' for this run: DCP needs more than one rank; 'auto' picks it for
    sharded models only."""
    if not is_distributed():
        return FILE
    if setting == DCP or (setting == "auto" and backend.auto_dcp):
        return DCP
    return FILE


def warn_single_process(setting: str) -> bool:
    """Warn (once per caller) that checkpoint_format='dcp' writes files in one process."""
    if setting != DCP or is_distributed():
        return False
    warnings.warn("checkpoint_format='dcp' needs a process group of more than one rank; "
                  "this single-process run writes single .safetensors checkpoints "
                  "(they load on any number of ranks too)", stacklevel=4)
    return True


__all__ = ["DCP", "FILE", "checkpointer_for", "resolve_format", "warn_single_process"]
