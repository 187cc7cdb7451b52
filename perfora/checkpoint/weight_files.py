"""Keys and shapes of a framework's weight files, read from their headers without loading a
tensor: to check that a checkpoint's weights and perfora's controller file belong together
before anything changes."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

from ..errors import CheckpointError
from .files import read_regular_file
from .schema import MAX_HEADER_BYTES, check_safetensors_header, parse_json

Shapes = dict[str, tuple[int, ...]]


def safetensors_shapes(path: str | os.PathLike) -> Shapes:
    """Tensor name -> shape from a safetensors file's header (its tensors are not read)."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path} is truncated ({size} bytes)")
            (length,) = struct.unpack("<Q", head)
            if length <= 0 or length > MAX_HEADER_BYTES or 8 + length > size:
                raise CheckpointError(f"{path} is truncated or corrupt: its header says "
                                      f"{length} bytes, the file has {size}")
            raw = handle.read(length)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    header = parse_json(raw, f"{path}: the safetensors header")
    entries, _ = check_safetensors_header(header, size - 8 - length, str(path))
    return {entry.name: tuple(entry.shape) for entry in entries}


def pickle_shapes(path: str | os.PathLike) -> Shapes:
    """Tensor name -> shape of a ``torch.save`` state dict, loaded with ``weights_only=True``
    and memory-mapped (the tensors' data is not read)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a corrupt or non-zip file: the framework would fail too
        raise CheckpointError(f"cannot read the weights in {path}: {exc}") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict")
    return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def folder_shapes(folder: str | os.PathLike, single: str, index: str) -> Shapes | None:
    """The shapes of a model saved in ``folder`` as one file ``single`` or as the shards an
    ``index`` file (``{"weight_map": {name: shard}}``) names; None when neither is there."""
    folder = Path(folder)
    read = safetensors_shapes if single.endswith(".safetensors") else pickle_shapes
    if (folder / single).is_file():
        return read(folder / single)
    if not (folder / index).is_file():
        return None
    try:
        weight_map = json.loads(read_regular_file(folder / index, MAX_HEADER_BYTES,
                                                  "weights index"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{folder / index} is not a weights index: {exc}") from exc
    shapes: Shapes = {}
    for shard in shards:
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise CheckpointError(f"{folder / index} names a shard outside its folder: "
                                  f"{str(shard)[:80]!r}")
        shapes.update(read(folder / shard))
    return shapes
