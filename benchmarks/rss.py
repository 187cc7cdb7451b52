"""Peak resident memory of this process on Linux, for the CPU memory benchmarks.

``VmHWM`` (the high-water mark of the resident set) is reset through
``/proc/self/clear_refs`` right before the measured work. A process started with
``MALLOC_ENV`` hands every freed tensor of 64 KiB or more back to the system at once, so
the mark follows the tensors alive, not what the allocator kept.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def rss_bytes() -> int:
    """This process's resident size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    """Set this process's peak resident size (VmHWM) to its current size (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    """This process's peak resident size since the last reset."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


@contextlib.contextmanager
def malloc_env() -> Iterator[None]:
    """``MALLOC_ENV`` in this process's environment while processes are started in the block
    (``spawn`` copies it), restored afterwards: the caller's later children keep their own."""
    saved = {key: os.environ.get(key) for key in MALLOC_ENV}
    os.environ.update(MALLOC_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
