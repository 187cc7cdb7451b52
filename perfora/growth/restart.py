"""The contract between `perfora launch` and a training script it restarts.

The script reads its attempt number from ``PERFORA_LAUNCH_ATTEMPT``, saves ``switch_N``
checkpoints into its run folder, and calls :func:`mark_training_complete` when done; the
launcher (:mod:`perfora.cli.launch`) reads the same names.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

from ..checkpoint.files import atomic_write_text
from ..distributed.collectives import is_rank_zero

COMPLETE_MARKER = ".training_complete"
"""File a script writes (rank 0) into its run folder when training is complete."""

ATTEMPT_ENV = "PERFORA_LAUNCH_ATTEMPT"
"""Environment variable holding the attempt number (1, 2, ...) for the script."""

INIT_FLAG = "--perforate_model_parallel"
LOAD_FLAG = "--pai_load_folder"

_SWITCH_RE = re.compile(r"^switch_(\d+)\.(pt|safetensors|dcp)$")


def run_completed(folder: str | os.PathLike) -> bool:
    """True when the newest ``latest`` checkpoint in ``folder`` (a file or a DCP folder)
    says the controller completed, marker or not; False when none can be read."""
    path = Path(folder)
    candidates = [(p, p.stat().st_mtime) for p in (path / "latest.safetensors",
                                                   path / "latest.dcp" / "perfora.json")
                  if p.is_file()]
    if not candidates:
        return False
    newest = max(candidates, key=lambda item: item[1])[0]
    try:
        meta = (json.loads(newest.read_text("utf-8")) if newest.suffix == ".json"
                else _safetensors_meta(newest))
        return bool(meta.get("controller", {}).get("completed", False))
    except (OSError, ValueError, AttributeError):
        return False


def _safetensors_meta(path: Path) -> dict:
    """perfora's JSON state from a checkpoint file's header, without reading its tensors."""
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        if size > _HEADER_CAP:
            raise ValueError(f"header of {size} bytes")
        header = json.loads(handle.read(size))
    return json.loads(header.get("__metadata__", {}).get("perfora", "{}"))


_HEADER_CAP = 256 * 1024 * 1024


def newest_switch(folder: str | os.PathLike) -> int | None:
    """The highest N of the ``switch_N.pt`` / ``switch_N.safetensors`` files and
    ``switch_N.dcp`` folders (DCP checkpoints) in ``folder``."""
    path = Path(folder)
    if not path.is_dir():
        return None
    numbers = [int(m.group(1)) for p in path.iterdir() if (m := _SWITCH_RE.match(p.name))]
    return max(numbers) if numbers else None


def is_training_complete(folder: str | os.PathLike) -> bool:
    """True when the run in ``folder`` wrote its completion marker."""
    return (Path(folder) / COMPLETE_MARKER).is_file()


def mark_training_complete(folder: str | os.PathLike) -> None:
    """Write ``folder/.training_complete`` (rank 0 only; atomic) so the launcher stops."""
    if is_rank_zero():
        atomic_write_text(Path(folder) / COMPLETE_MARKER, "training complete\n")
