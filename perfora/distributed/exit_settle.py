"""A clean exit after gloo collectives: let gloo's worker threads finish before Python ends.

Why a job could abort at exit ("terminate called without an active exception", SIGABRT) after
``barrier()`` and ``destroy_process_group()``, found from the core files of aborted jobs:

- During ``backward()`` torch keeps a Python object in the thread's state (autograd's
  ``contextvars.Context``). Every collective launched then, such as DDP's or FSDP's gradient
  reductions, copies that thread state into its gloo work object.
- ``barrier()`` on gloo keeps weak references to the work still in progress, and gloo's
  worker thread destroys the barrier's work after the barrier has returned to Python. If
  that drops the last reference to a gradient reduction, the reduction's thread state is
  freed on the worker thread, which needs the GIL to release the Python object.
- When the worker thread is scheduled late (a loaded machine) the main thread may already be
  finalizing the interpreter. Taking the GIL then ends the thread inside a destructor that
  may not throw, and the C++ runtime aborts the process.

The race is torch's, not perfora's: any script whose last collectives ran during a backward
pass can hit it. :func:`settle_at_exit` makes it go away for a process that uses perfora:
at interpreter exit (``atexit``, while the interpreter still runs) the main thread releases
the GIL until no other thread of the process is runnable, so a pending release finishes
first. It costs a few milliseconds at exit.

A second form of the same race hangs instead of aborting, found with gdb on stuck ranks: a
script that ends ``main()`` with ``barrier()`` and ``destroy_process_group()`` while its DDP
model is a local variable. When ``main()`` returns, the DDP wrapper is freed; its C++
reducer holds the last reference to the process group, so gloo's destructor runs there and
joins the worker threads while the main thread holds the GIL, and a worker thread that is
still freeing the barrier's work waits for the GIL: a deadlock (torch 2.13, with or without
perfora: ``benchmarks/fabric_exit.py``). So
:func:`settle_at_exit` also keeps a Python reference to the default process group until
exit: the reducer then never drops the last one, and at exit the group is released from
Python after the threads settled.
"""

from __future__ import annotations

import atexit
import threading
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

_STEP_S = 0.002  # one pause with the GIL released
_QUIET_CHECKS = 2  # consecutive pauses after which no other thread was runnable
_LIMIT_S = 1.0  # never hold the exit longer than this


_KEPT_GROUPS: list[Any] = []  # process-wide, as gloo's threads are: released at exit


def settle_at_exit() -> None:
    """Keep the default process group referenced until exit, and register :func:`_at_exit`
    to run then (once, however often this is called)."""
    if dist.is_available() and dist.is_initialized():
        group = dist.group.WORLD
        if group is not None and not any(kept is group for kept in _KEPT_GROUPS):
            _KEPT_GROUPS.append(group)
    atexit.unregister(_at_exit)
    atexit.register(_at_exit)


def _at_exit() -> None:
    """Let gloo's threads settle, then release the kept process groups (from Python, with
    the interpreter still running)."""
    settle_threads()
    _KEPT_GROUPS.clear()


def settle_threads(limit_s: float = _LIMIT_S) -> float:
    """Release the GIL in short pauses until no other thread of this process has been
    runnable for two pauses in a row (at most ``limit_s``); the seconds it waited. Where
    thread states cannot be read (no ``/proc``) it pauses a fixed 50 ms."""
    start = time.monotonic()
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        time.sleep(0.05)
        return time.monotonic() - start
    own = threading.get_native_id()
    quiet = 0
    while quiet < _QUIET_CHECKS and time.monotonic() - start < limit_s:
        time.sleep(_STEP_S)
        quiet = 0 if _others_runnable(tasks, own) else quiet + 1
    return time.monotonic() - start


def _others_runnable(tasks: Path, own: int) -> bool:
    """True when a thread of this process other than ``own`` is running or runnable."""
    for task in tasks.iterdir():
        if task.name == str(own):
            continue
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        state = stat.rpartition(")")[2].split()[:1]
        if state == ["R"]:
            return True
    return False

