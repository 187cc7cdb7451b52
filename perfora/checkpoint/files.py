"""Files on disk: atomic writes (temp file, fsync, rename), appends that never follow a
symlink, and the cleanup of temp files a killed write left behind."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

from ..errors import CheckpointError

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


def _process_umask() -> int:
    """This process's umask, read without changing it where Linux says it (its ``status``
    file), else by setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _target_mode(path: Path) -> int | None:
    """The permission bits an atomic write gives ``path``: those of the regular file it
    replaces, else what a plain ``open`` would create (0666 less the umask); None where
    ``chmod`` does not apply (Windows)."""
    if not hasattr(os, "fchmod"):
        return None
    try:
        current = os.lstat(path)
        if stat.S_ISREG(current.st_mode):
            return stat.S_IMODE(current.st_mode)
    except OSError:
        pass
    return 0o666 & ~_process_umask()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync it, rename it over the target, fsync
    the folder (see :func:`durable_writes`). A symlink at ``path`` is replaced, never
    followed. The file gets the replaced file's permissions, or a new file's under the
    umask (0644 under the usual 022), as a plain ``open`` would."""
    path = Path(path)
    durable = durable_writes()
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _target_mode(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # mkstemp's 0600 would make run files private to their owner
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


def read_regular_file(path: str | os.PathLike, cap: int, what: str = "file") -> bytes:
    """The bytes of a small regular file, at most ``cap`` of them, else CheckpointError.

    Opened without following a symlink and without blocking (a FIFO cannot hang the load),
    checked to be a regular file after opening (not a device like ``/dev/zero``), and capped
    by the bytes actually read (``cap + 1`` are asked for), not by what ``stat`` claims."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | \
        getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise CheckpointError(f"cannot read the {what} {path}: {exc.strerror or exc} (it must "
                              "be a regular file, not a symlink)") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"the {what} {path} is not a regular file (a FIFO, device "
                                  "or folder); a checkpoint holds regular files only")
        chunks, left = [], cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > cap:
        raise CheckpointError(f"the {what} {path} is larger than the {cap} bytes it may have")
    return data
