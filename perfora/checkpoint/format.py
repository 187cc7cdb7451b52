"""Save and load checkpoints safely: tensors in safetensors, structure and state as JSON.

A checkpoint is one safetensors file whose header metadata holds a JSON document, so the
tensors and the state that describes them are written together in one atomic rename. No
pickle is ever loaded: a file that looks like one is refused before anything is parsed.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save

from ..errors import CheckpointError
from . import schema as checkpoint_schema
from .files import atomic_write_bytes
from .schema import StateCheck, TensorEntry, check_safetensors_header, parse_json, validate_meta

FORMAT = "perfora-checkpoint"
FORMAT_VERSION = 1
_META_KEY = "perfora"


@dataclass
class Checkpoint:
    """The content of one checkpoint file: tensors grouped by prefix, plus JSON metadata."""

    tensors: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def to_storable(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU copies that share no memory (safetensors requires it)."""
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint) -> None:
    """Write a checkpoint atomically."""
    atomic_write_bytes(path, encode_checkpoint(checkpoint))


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The bytes of a checkpoint file: safetensors with the JSON state as metadata."""
    flat: dict[str, torch.Tensor] = {}
    for prefix, group in checkpoint.tensors.items():
        if "/" in prefix:
            raise ValueError(f"tensor group name {prefix!r} must not contain '/'")
        for key, value in to_storable(group).items():
            flat[f"{prefix}/{key}"] = value
    meta = dict(checkpoint.meta)
    meta.setdefault("format", FORMAT)
    meta.setdefault("format_version", FORMAT_VERSION)
    try:
        header = json.dumps(meta, allow_nan=True)
    except TypeError as exc:
        raise CheckpointError(f"checkpoint state is not JSON-serializable: {exc}") from exc
    return st_save(flat, metadata={_META_KEY: header})


def _refuse_unsafe(path: Path, head: bytes, size: int) -> None:
    # A safetensors header length may start with byte 0x80 too: only a file whose JSON
    # header does not open at byte 8 can be a pickle.
    looks_safetensors = len(head) > 8 and head[8:9] == b"{"
    if not looks_safetensors and (head[:4] == b"PK\x03\x04" or head[:1] == b"\x80"):
        raise CheckpointError(
            f"{path} is a pickle-based file (torch.save format); perfora never unpickles "
            "files because that can run arbitrary code. Re-save it with perfora, or load it "
            "yourself with torch.load(weights_only=True) if you trust it")
    if size < 8:
        raise CheckpointError(f"{path} is truncated ({size} bytes): not a perfora checkpoint")
    if not looks_safetensors and len(head) > 8:
        raise CheckpointError(
            f"{path} is not a safetensors file (its JSON header would open at byte 8; it "
            f"starts {head[:12]!r}): not a perfora checkpoint")
    (header_len,) = struct.unpack("<Q", head[:8])
    if header_len <= 0 or 8 + header_len > size:
        raise CheckpointError(f"{path} is truncated or corrupt: its header says "
                              f"{header_len} bytes but the file has {size}")


def load_checkpoint(path: str | os.PathLike, check_state: StateCheck | None = None
                    ) -> Checkpoint:
    """Read a checkpoint; corrupt, truncated, pickle, foreign or inconsistent files raise
    CheckpointError naming what is wrong.

    The headers are read and checked first (size and nesting caps, every field of perfora's
    state this floor knows, tensor shapes and byte ranges against the file size; the
    controller's and rule's state by ``check_state``, see
    :func:`perfora.checkpoint.schema.validate_meta`); tensor data is read only then, one
    tensor at a time, straight into its tensor."""
    path = Path(path)
    if path.is_dir() and not path.name.endswith(".dcp"):
        found = sorted(p.name for p in path.glob("*.safetensors"))
        raise CheckpointError(
            f"{path} is a folder, not a checkpoint file; pass one of the checkpoints in it: "
            f"{', '.join(found)}" if found else f"{path} is a folder with no checkpoint in it")
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    with handle:
        size = os.fstat(handle.fileno()).st_size
        head = handle.read(16)
        _refuse_unsafe(path, head, size)
        (header_len,) = struct.unpack("<Q", head[:8])
        if header_len > checkpoint_schema.MAX_HEADER_BYTES:
            raise CheckpointError(f"{path}: its header claims {header_len} bytes, more than "
                                  f"the {checkpoint_schema.MAX_HEADER_BYTES} a checkpoint "
                                  "header may have")
        handle.seek(8)
        raw = handle.read(header_len)
        if len(raw) != header_len:
            raise CheckpointError(f"{path} is truncated: the header ends early")
        meta, entries = _checked_headers(path, raw, size - 8 - header_len, check_state)
        tensors = _read_tensors(path, handle, entries, 8 + header_len)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for flat, value in tensors.items():
        prefix, _, key = flat.partition("/")
        groups.setdefault(prefix, {})[key] = value
    return Checkpoint(tensors=groups, meta=meta)


def _checked_headers(path: Path, raw: bytes, data_len: int, check_state: StateCheck | None
                     ) -> tuple[dict[str, Any], list[TensorEntry]]:
    """perfora's JSON state and the tensor entries of a safetensors header, both checked."""
    header = parse_json(raw, f"{path}: the safetensors header")
    try:
        entries, metadata = check_safetensors_header(header, data_len, "tensor")
    except CheckpointError as exc:
        raise CheckpointError(f"{path} is corrupt or truncated: {exc}") from None
    text = metadata.get(_META_KEY)
    if text is None:
        raise CheckpointError(f"{path} is a safetensors file but not a perfora checkpoint "
                              "(no perfora metadata); use perfora.load_weights for plain "
                              "state_dict files")
    meta = parse_json(text, f"{path}: perfora metadata")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise CheckpointError(f"{path} has format {str(found)[:40]!r}, expected {FORMAT}")
    version = meta.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise CheckpointError(f"{path} was written by a newer perfora (format version "
                              f"{version}); upgrade perfora to read it")
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    for entry in entries:
        prefix, _, key = entry.name.partition("/")
        shapes.setdefault(prefix, {})[key] = entry.shape
    try:
        validate_meta(meta, shapes, check_state)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    return meta, entries


def _read_tensors(path: Path, handle: Any, entries: list[TensorEntry], start: int
                  ) -> dict[str, torch.Tensor]:
    """Each checked tensor read from its byte range into a tensor of its own."""
    out: dict[str, torch.Tensor] = {}
    for entry in sorted(entries, key=lambda e: e.begin):
        tensor = torch.empty(entry.shape, dtype=entry.dtype)
        nbytes = entry.end - entry.begin
        if nbytes:
            handle.seek(start + entry.begin)
            buffer = tensor.reshape(-1).view(torch.uint8).numpy()
            if handle.readinto(memoryview(buffer)) != nbytes:
                raise CheckpointError(f"{path} is truncated: tensor {entry.name!r} ends early "
                                      "(was the file cut while it was read?)")
            if sys.byteorder == "big" and tensor.element_size() > 1:
                raise CheckpointError("perfora reads checkpoints on little-endian machines "
                                      "only")
            if entry.dtype == torch.bool and int(tensor.view(torch.uint8).max()) > 1:
                raise CheckpointError(f"{path}: tensor {entry.name!r} is bool but holds bytes "
                                      "other than 0 and 1")
        out[entry.name] = tensor
    return out


