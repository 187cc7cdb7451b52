"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP): file IO only.

A DCP checkpoint is a folder ``<name>.dcp``: DCP's ``.metadata`` and ``__<rank>_<n>.distcp``
shard files, which hold tensors only (each rank writes its own shards, nothing is
gathered), and ``perfora.json`` beside them with perfora's state (structure, controller,
rule, config, optimizer hyperparameters). Every rank writes into ``.<name>.dcp.tmp``;
rank 0 writes ``perfora.json`` last and renames the folder into place, so a folder under
the final name is always complete and a failed write leaves the previous one valid.

DCP's ``.metadata`` is a pickle: it is read with an unpickler that builds only DCP's own
metadata classes (perfora never unpickles anything else); the shards are read by
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..distributed.collectives import is_distributed, is_rank_zero
from ..errors import CheckpointError
from .files import _fsync_folder, atomic_write_text, durable_writes, read_regular_file
from .schema import check_dict, check_list, check_str, parse_json

DCP_SUFFIX = ".dcp"
META_FILE = "perfora.json"
DCP_FORMAT = "perfora-dcp-checkpoint"
DCP_FORMAT_VERSION = 1
MAX_META_BYTES = 64 * 1024 * 1024
MAX_DCP_METADATA_BYTES = 512 * 1024 * 1024
_NO_DIST_WARNING = "torch.distributed is disabled, unavailable or uninitialized"
_SHARDED_TENSOR = "Please use DTensor instead"  # FSDP1's state dicts warn on every call

Tensors = dict[str, Any]
"""Groups of tensors (``{"model": {...}, "optim": {fqn: {key: t}}}``), nested as DCP nests."""


def is_dcp_path(path: str | os.PathLike) -> bool:
    """True for a DCP checkpoint: a folder, or a name ending in ``.dcp``."""
    path = Path(path)
    return path.suffix == DCP_SUFFIX or path.is_dir()


def temp_path(path: Path) -> Path:
    """The folder a write fills before it is renamed to ``path``."""
    return path.parent / f".{path.name}.tmp"


def old_path(path: Path) -> Path:
    """Where the previous checkpoint waits while the new one is renamed into place."""
    return path.parent / f".{path.name}.old"


def readable_path(path: str | os.PathLike) -> Path:
    """``path``, or the previous checkpoint when a write died between its two renames."""
    path = Path(path)
    if not (path / META_FILE).is_file() and (old_path(path) / META_FILE).is_file():
        return old_path(path)
    return path


def written_at(path: Path) -> float | None:
    """When a checkpoint (file or DCP folder) was completed; None when it is not there."""
    try:
        return (readable_path(path) / META_FILE).stat().st_mtime if is_dcp_path(path) \
            else path.stat().st_mtime
    except OSError:
        return None


def newest_checkpoint(paths: list[Path]) -> Path:
    """The most recently completed of the candidate paths (the first when none exists)."""
    found = [(t, -i, p) for i, p in enumerate(paths) if (t := written_at(p)) is not None]
    return max(found)[2] if found else paths[0]


# ----------------------------------------------------------------------------- state dicts
def get_state(module: nn.Module, optimizer: torch.optim.Optimizer | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, optimizer) state by parameter name, as DCP saves them: the FSDP root's are
    this rank's shards, nothing is gathered (``get_state_dict``)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SHARDED_TENSOR)
        model_sd, optim_sd = get_state_dict(module, [optimizer] if optimizer is not None
                                            else [])
    return dict(model_sd), optim_sd


def set_state(module: nn.Module, optimizer: torch.optim.Optimizer | None,
              model_sd: Mapping[str, Any], optim_sd: Mapping[str, Any] | None,
              source: str, strict_optimizer: bool = True) -> None:
    """``set_state_dict`` with loaded tensors; CheckpointError naming ``source`` when they do
    not fit the model or the optimizer. ``strict_optimizer=False``: the saved optimizer state
    may lack parameters (the caller clears what they hold)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SHARDED_TENSOR)
            set_model_state_dict(module, dict(model_sd))
            if optimizer is not None:
                set_optimizer_state_dict(module, [optimizer], optim_sd,
                                         options=StateDictOptions(strict=strict_optimizer))
    except (ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"{source}: the saved state does not fit the model or the "
                              f"optimizer registered now ({exc}); build the same model and "
                              "register the same optimizer as the saved run") from exc


def split_optimizer(optim_sd: Mapping[str, Any]) -> tuple[dict, dict]:
    """A by-name optimizer state as (tensors {fqn: {key: t}}, JSON: groups + other values)."""
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    plain: dict[str, dict[str, Any]] = {}
    for fqn, entry in optim_sd["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors.setdefault(fqn, {})[key] = value
            else:
                plain.setdefault(fqn, {})[key] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()}
              for group in optim_sd["param_groups"]]
    return tensors, {"state": plain, "param_groups": groups}


def join_optimizer(tensors: Mapping[str, Mapping[str, torch.Tensor]],
                   saved: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`split_optimizer`: the by-name state ``set_state_dict`` takes."""
    plain = saved.get("state", {})
    state = {fqn: {**plain.get(fqn, {}), **entry} for fqn, entry in tensors.items()}
    groups = [{k: (tuple(v) if isinstance(v, list) and k != "params" else v)
               for k, v in group.items()} for group in saved["param_groups"]]
    return {"state": state, "param_groups": groups}


def check_optimizer_meta(data: Any, tensors: Mapping[str, Any]) -> None:
    """The JSON half of a by-name optimizer state: groups listing parameter names once, and
    every saved optimizer tensor (``<name>.<key>``) belonging to one of them."""
    data = check_dict(data, "optimizer")
    seen: set[str] = set()
    for i, group in enumerate(check_list(data.get("param_groups"), "optimizer.param_groups")):
        group = check_dict(group, f"optimizer.param_groups[{i}]")
        for j, name in enumerate(check_list(group.get("params"),
                                            f"optimizer.param_groups[{i}].params")):
            check_str(name, f"optimizer.param_groups[{i}].params[{j}]")
            if name in seen:
                raise CheckpointError(f"optimizer.param_groups[{i}].params[{j}]: {name!r} "
                                      "is listed twice")
            seen.add(name)
    check_dict(data.get("state", {}), "optimizer.state")
    for key in tensors:
        if not any(key.startswith(f"{name}.") for name in seen):
            raise CheckpointError(f"optimizer tensor {key!r} belongs to no parameter group")


# ----------------------------------------------------------------------------- writing
def _agree(error: BaseException | None) -> None:
    """Rank 0's outcome to every rank (a collective): all raise its error, or none does."""
    if not is_distributed():
        if error is not None:
            raise error
        return
    box: list[Any] = [None if error is None else f"{type(error).__name__}: {error}"]
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    if box[0] is not None:
        raise CheckpointError(f"rank 0 could not write the checkpoint: {box[0]}")


def save_dcp(path: str | os.PathLike, tensors: Tensors, meta: Mapping[str, Any]) -> None:
    """Write a DCP checkpoint folder (a collective: every rank calls it with its shards).

    The shards go to a temp folder, rank 0 adds ``perfora.json`` and renames the folder
    over ``path``; a failure on any rank raises on every rank and leaves ``path`` as it was."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp = temp_path(path)
    error: BaseException | None = None
    if is_rank_zero():
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        except OSError as exc:
            error = CheckpointError(f"cannot create {tmp}: {exc}")
    _agree(error)
    writer = dcp.FileSystemWriter(tmp, sync_files=durable_writes())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST_WARNING)
        try:
            dcp.save(tensors, storage_writer=writer, no_dist=not is_distributed())
        except (Exception, dcp.api.CheckpointException) as exc:  # the latter: BaseException
            raise CheckpointError(f"writing the shards of {path} failed: {exc}") from exc
    if is_rank_zero():
        try:
            body = {**meta, "format": DCP_FORMAT, "format_version": DCP_FORMAT_VERSION}
            atomic_write_text(tmp / META_FILE, json.dumps(body, allow_nan=True))
            _swap_into_place(tmp, path)
        except (OSError, TypeError, ValueError) as exc:
            error = CheckpointError(f"cannot write {path}: {exc}")
    _agree(error)


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Rename the complete ``tmp`` folder to ``path``; the previous one is removed after."""
    old = old_path(path)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(old, ignore_errors=True)  # (kept while it is the only complete one)
        os.replace(path, old)
    os.replace(tmp, path)
    if durable_writes():
        _fsync_folder(path.parent)
    shutil.rmtree(old, ignore_errors=True)


def copy_dcp(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """A second name for a complete DCP folder (a collective: rank 0 links, every rank
    learns the outcome)."""
    error: BaseException | None = None
    if is_rank_zero():
        try:
            _link_copy(Path(src), Path(dst))
        except OSError as exc:
            error = CheckpointError(f"cannot write {dst}: {exc}")
    _agree(error)


def _link_copy(src: Path, dst: Path) -> None:
    """Hard links where the file system has them (shard files are never changed in place),
    else copies; into a temp folder renamed into place, like a save."""
    tmp = temp_path(dst)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for entry in os.scandir(src):
        if not entry.is_file(follow_symlinks=False):
            continue
        try:
            os.link(entry.path, tmp / entry.name)
        except OSError:
            shutil.copy2(entry.path, tmp / entry.name)
    _swap_into_place(tmp, dst)


# ----------------------------------------------------------------------------- reading
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "ChunkStorageMetadata", "TensorStorageMetadata", "TensorProperties",
        "StorageMeta", "MetadataIndex", "_MEM_FORMAT_ENCODING", "BytesStorageMetadata"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
    "torch": {"Size"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes, torch.Size and dtypes; refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


def read_dcp_metadata(path: Path) -> Any:
    """DCP's ``.metadata`` of a checkpoint folder, unpickled with the allow-list above."""
    file = path / ".metadata"
    if not os.path.lexists(file):
        raise CheckpointError(f"{path} is incomplete: no DCP metadata (.metadata)")
    data = read_regular_file(file, MAX_DCP_METADATA_BYTES, "DCP metadata")
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{file} is corrupt or not DCP metadata: {exc}") from exc
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{file} is not DCP metadata")
    return metadata


class _SafeReader:
    """A FileSystemReader whose metadata comes from :func:`read_dcp_metadata`."""

    def __new__(cls, path: Path, metadata: Any) -> Any:
        from torch.distributed.checkpoint import FileSystemReader

        class Reader(FileSystemReader):
            def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
                return metadata

        return Reader(path)


Shapes = dict[str, dict[str, tuple[tuple[int, ...], torch.dtype]]]
"""Shape and dtype of every saved tensor: group ("model", "optim", "best") -> key."""


def _tensor_shapes(path: Path, metadata: Any) -> Shapes:
    """Every saved tensor's group, key, shape and dtype, with the shard files checked."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    names = {p.name for p in path.iterdir()}
    ends: dict[str, int] = {}
    for index, info in metadata.storage_data.items():
        file = getattr(info, "relative_path", None)
        if not isinstance(file, str) or "/" in file or "\\" in file or file not in names:
            raise CheckpointError(f"{path} is incomplete: the shard file {str(file)[:80]!r} "
                                  f"of {getattr(index, 'fqn', '?')!r} is missing")
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 \
                or length < 0:
            raise CheckpointError(f"{path}: DCP metadata gives {file!r} no valid byte range")
        ends[file] = max(ends.get(file, 0), offset + length)
    _check_shard_sizes(path, ends)
    planner = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    shapes: Shapes = {}
    for fqn, item in metadata.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            raise CheckpointError(f"{path}: {fqn!r} is not a tensor (perfora's DCP "
                                  "checkpoints hold tensors only)")
        route = planner.get(fqn)
        if isinstance(route, tuple | list) and len(route) >= 2:
            group, key = str(route[0]), ".".join(str(r) for r in route[1:])
        else:
            group, _, key = fqn.partition(".")
        shapes.setdefault(group, {})[key] = (tuple(item.size), item.properties.dtype)
    return shapes


def _check_shard_sizes(path: Path, ends: Mapping[str, int]) -> None:
    """Each shard file is a regular file exactly as long as DCP's metadata says its items
    reach: a truncated shard, or one from another checkpoint, is refused before any tensor
    is read (and before the model changes)."""
    for name, end in sorted(ends.items()):
        info = os.lstat(path / name)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{path}: the shard {name!r} is not a regular file")
        if info.st_size != end:
            what = "truncated" if info.st_size < end else "longer than its metadata says"
            raise CheckpointError(f"{path}: the shard {name!r} has {info.st_size} bytes but "
                                  f"the DCP metadata says {end}: it is {what}, or a shard of "
                                  "another checkpoint; load an intact checkpoint")


def read_dcp(path: str | os.PathLike) -> tuple[dict[str, Any], Shapes, Any]:
    """perfora's JSON state, the saved tensors' shapes and DCP's metadata of a folder.

    CheckpointError naming the folder when it is missing, incomplete or corrupt."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"no DCP checkpoint at {path}")
    file = path / META_FILE
    if not os.path.lexists(file):
        runs = sorted(p.name for p in path.glob("*.safetensors")) + \
            sorted(p.name for p in path.glob("*.dcp"))
        if runs or (path / "metrics.csv").exists():
            example = "latest.safetensors" if "latest.safetensors" in runs or not runs \
                else runs[0]
            raise CheckpointError(f"{path} is a run folder, not one checkpoint: pass one of its "
                                  f"checkpoints ({', '.join(runs[:4]) or 'none yet'}), e.g. "
                                  f"{path / example}, or controller.load('latest') with "
                                  "run_dir set to it")
        raise CheckpointError(f"{path} is incomplete: no {META_FILE}; a write was "
                              "interrupted, load the previous checkpoint")
    raw = read_regular_file(file, MAX_META_BYTES, "perfora state")
    meta = check_dict(parse_json(raw, str(file)), str(file))
    if meta.get("format") != DCP_FORMAT:
        raise CheckpointError(f"{file} has format {str(meta.get('format'))[:40]!r}, "
                              f"expected {DCP_FORMAT}")
    version = meta.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) \
            and version > DCP_FORMAT_VERSION:
        raise CheckpointError(f"{path} was written by a newer perfora (format version "
                              f"{version}); upgrade perfora to read it")
    metadata = read_dcp_metadata(path)
    return meta, _tensor_shapes(path, metadata), metadata


def load_dcp(path: str | os.PathLike, target: Tensors, metadata: Any) -> None:
    """Read the saved tensors into ``target`` in place (a collective when distributed; DCP
    cuts each tensor to the shards ``target`` holds, whatever the world size that saved it)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST_WARNING)
        try:
            dcp.load(target, storage_reader=_SafeReader(path, metadata),
                     no_dist=not is_distributed())
        except (Exception, dcp.api.CheckpointException) as exc:  # the latter: BaseException
            raise CheckpointError(f"{path}: reading the shards failed (corrupt or "
                                  f"truncated?): {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    """A short description of a (DCP) exception: its first lines, at most 300 characters."""
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")
