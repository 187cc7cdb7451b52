"""Save and load checkpoints safely: tensors in safetensors, structure and state as JSON.

A checkpoint is one safetensors file whose header metadata holds a JSON document, so the
tensors and the state that describes them are written together in one atomic rename. No
pickle is ever loaded: a file that looks like one is refused before anything is parsed.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from .errors import CheckpointError, ShapeMismatchError
from .layers import unwrap_model

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


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp file in the same folder, then rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Atomic write of a text file."""
    atomic_write_bytes(path, text.encode("utf-8"))


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
    (header_len,) = struct.unpack("<Q", head[:8])
    if header_len <= 0 or 8 + header_len > size:
        raise CheckpointError(f"{path} is truncated or corrupt: its header says "
                              f"{header_len} bytes but the file has {size}")


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint; corrupt, truncated, pickle or foreign files raise CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    data = path.read_bytes()
    _refuse_unsafe(path, data[:16], len(data))
    try:
        header_len = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + header_len])
        tensors = st_load(data)
    except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is corrupt or truncated: {exc}") from exc
    raw = (header.get("__metadata__") or {}).get(_META_KEY)
    if raw is None:
        raise CheckpointError(f"{path} is a safetensors file but not a perfora checkpoint "
                              "(no perfora metadata); use perfora.load_weights for plain "
                              "state_dict files")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} has format {meta.get('format')!r}, expected {FORMAT}")
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise CheckpointError(f"{path} was written by a newer perfora (format version "
                              f"{meta['format_version']}); upgrade perfora to read it")
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for flat, value in tensors.items():
        prefix, _, key = flat.partition("/")
        groups.setdefault(prefix, {})[key] = value
    return Checkpoint(tensors=groups, meta=meta)


def load_state_into(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """load_state_dict with messages that name the tensor and both shapes."""
    inner = unwrap_model(model)
    own = inner.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise ShapeMismatchError(
            f"{source} does not fit this model: missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{'...' if len(unexpected) > 5 else ''}. Build the model the same way as the run "
            "that saved it (same class and sizes)")
    for key, value in state.items():
        if own[key].shape != value.shape:
            raise ShapeMismatchError(
                f"{source}: tensor {key!r} has shape {tuple(value.shape)} in the checkpoint "
                f"but {tuple(own[key].shape)} in this model; build the model with the same "
                "sizes as the run that saved it")
    inner.load_state_dict(dict(state), strict=True)


def save_model(path: str | os.PathLike, model: nn.Module, **meta: Any) -> None:
    """Save a perforated model (structure + weights) without controller state."""
    from .convert import layer_specs

    ckpt = Checkpoint(tensors={"model": unwrap_model(model).state_dict()},
                      meta={"structure": layer_specs(model), **meta})
    save_checkpoint(path, ckpt)


def load_model(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load structure and weights into ``model`` (converted or not); returns it."""
    from .convert import rebuild_structure

    ckpt = load_checkpoint(path)
    if "model" not in ckpt.tensors:
        raise CheckpointError(f"{path} holds no model weights")
    from .errors import ConversionError

    try:
        rebuild_structure(model, ckpt.meta.get("structure", {}))
    except ConversionError as exc:
        raise ShapeMismatchError(f"{path}: {exc}") from exc
    load_state_into(model, ckpt.tensors["model"], str(path))
    return model
