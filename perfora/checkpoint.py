"""Save and load checkpoints safely: tensors in safetensors, structure and state as JSON.

A checkpoint is one safetensors file whose header metadata holds a JSON document, so the
tensors and the state that describes them are written together in one atomic rename. No
pickle is ever loaded: a file that looks like one is refused before anything is parsed.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import stat
import struct
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import nn

from . import checkpoint_schema
from .checkpoint_schema import (
    TensorEntry,
    check_safetensors_header,
    parse_json,
    validate_meta,
)
from .errors import CheckpointError, ShapeMismatchError
from .layers import dendritic_layers, unwrap_model

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


TEMP_PATTERN = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")
"""Names of the temp files :func:`atomic_write_bytes` creates (``.<name>.<random>.tmp``)."""


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(folder, flags)
    except OSError:
        return  # Windows, or a folder we may not open: the rename itself was done
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems (and platforms) do not fsync folders
    finally:
        os.close(fd)


def durable_writes() -> bool:
    """True unless the environment sets ``PERFORA_FSYNC=0``: then writes skip fsync (faster
    on slow file systems and in test suites; a power loss may then lose the newest file)."""
    return os.environ.get("PERFORA_FSYNC", "1").strip().lower() not in ("0", "false", "no",
                                                                          "off")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync it, rename it over the target, fsync
    the folder (see :func:`durable_writes`). A symlink at ``path`` is replaced, never
    followed."""
    path = Path(path)
    durable = durable_writes()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        _fsync_folder(path.parent)


def append_text(path: str | os.PathLike, text: str) -> bool:
    """Append to a regular file without following a symlink; False when ``path`` is not a
    regular file (missing, a symlink, a FIFO...): then rewrite it with atomic_write_text."""
    flags = (os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    if not hasattr(os, "O_NOFOLLOW") and os.path.islink(path):
        return False
    try:
        fd = os.open(path, flags)
    except OSError:  # ELOOP: a symlink; ENOENT; ENXIO: a FIFO without reader
        return False
    with os.fdopen(fd, "ab") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        handle.write(text.encode("utf-8"))
    return True


def remove_stale_temp_files(folder: str | os.PathLike) -> list[str]:
    """Delete temp files that killed writes left in ``folder``; returns their names.

    Only regular files (not symlinks) named like perfora's own temp files of its run files
    (``.latest.safetensors.k2j4h1x9.tmp``). Call it where one process writes the folder."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = TEMP_PATTERN.match(entry.name)
        if match is None or not _is_run_file_name(match["name"]):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(entry.name)
    return removed


def _is_run_file_name(name: str) -> bool:
    return name in RUN_FILE_NAMES or name.endswith(".safetensors")


RUN_FILE_NAMES = ("metrics.csv", "run.json", "best_arch_scores.csv", "history.png")
"""Files of a run folder besides checkpoints (``*.safetensors``)."""


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
    """Read a checkpoint; corrupt, truncated, pickle, foreign or inconsistent files raise
    CheckpointError naming what is wrong.

    The headers are read and checked first (size and nesting caps, every field of perfora's
    state, tensor shapes and byte ranges against the file size); tensor data is read only
    then, one tensor at a time, straight into its tensor."""
    path = Path(path)
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
        meta, entries = _checked_headers(path, raw, size - 8 - header_len)
        tensors = _read_tensors(path, handle, entries, 8 + header_len)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for flat, value in tensors.items():
        prefix, _, key = flat.partition("/")
        groups.setdefault(prefix, {})[key] = value
    return Checkpoint(tensors=groups, meta=meta)


def _checked_headers(path: Path, raw: bytes, data_len: int
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
        validate_meta(meta, shapes)
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


def check_state_fits(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """ShapeMismatchError naming the tensor unless ``state`` has exactly the model's keys and
    shapes (nothing is loaded)."""
    own = unwrap_model(model).state_dict()
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


def load_state_into(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """load_state_dict with messages that name the tensor and both shapes."""
    check_state_fits(model, state, source)
    unwrap_model(model).load_state_dict(dict(state), strict=True)


def shadow_copy(model: nn.Module) -> nn.Module | None:
    """A copy of ``model`` (unwrapped) whose tensors live on the meta device: it costs no
    memory, and a load can be rehearsed on it before the model itself is changed.

    None when the model cannot be copied (sharded DTensor parameters, or modules that
    refuse ``copy.deepcopy``)."""
    inner = unwrap_model(model)
    memo: dict[int, Any] = {}
    for tensor in itertools.chain(inner.parameters(), inner.buffers()):
        if type(tensor).__name__ == "DTensor" or type(tensor.data).__name__ == "DTensor":
            return None
        if id(tensor) in memo:
            continue
        empty = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
        memo[id(tensor)] = (nn.Parameter(empty, requires_grad=tensor.requires_grad)
                            if isinstance(tensor, nn.Parameter) else empty)
    try:
        return copy.deepcopy(inner, memo)
    except Exception:  # a module that cannot be copied: no rehearsal, the file is still checked
        return None


def rehearse_load(shadow: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Load ``state`` into a :func:`shadow_copy`: checks keys and shapes, moves no weights.

    The dendrite output weights ``v`` and set masks (dendrite sets x neurons each, small)
    get their real values, since code that runs after a load reads them (a learning rule
    checks that a candidate's ``v`` row is zero); every other tensor stays weightless."""
    check_state_fits(shadow, state, source)
    own = shadow.state_dict()
    real = {f"{path}.{name}" if path else name for path in dendritic_layers(shadow)
            for name in ("out_weight", "dendrite_mask")}
    weightless = {key: (value.detach().to("cpu", own[key].dtype, copy=True) if key in real
                        else torch.empty(value.shape, dtype=own[key].dtype, device="meta"))
                  for key, value in state.items()}
    shadow.load_state_dict(weightless, strict=True, assign=True)


_MOVED = ("fit_structure", "save_model", "load_model")
"""Model surgery that lived here; found in :mod:`perfora.growth.surgery` (which imports this
module, hence resolved on first use)."""


def __getattr__(name: str) -> Any:
    """The names in ``_MOVED``, from :mod:`perfora.growth.surgery` (this module stays file IO)."""
    if name in _MOVED:
        from .growth import surgery

        return getattr(surgery, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
