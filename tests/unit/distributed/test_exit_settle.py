"""The exit settle: at interpreter exit the main thread lets other threads (gloo's workers)
finish, so a Python object they release does not meet a finalizing interpreter."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time

import pytest

from perfora.distributed.exit_settle import settle_threads


def _hash_for(seconds: float) -> None:
    """Busy outside the GIL (hashlib releases it for large buffers), like a C++ thread."""
    data = b"x" * (4 << 20)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hashlib.sha256(data).digest()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_settle_waits_while_another_thread_runs_and_returns_once_all_are_idle():
    assert settle_threads() < 0.5  # nothing else runs: a few milliseconds
    worker = threading.Thread(target=_hash_for, args=(0.3,))
    worker.start()
    waited = settle_threads(limit_s=2.0)
    worker.join()
    assert waited >= 0.2  # it waited for the busy thread, not a fixed pause
    worker = threading.Thread(target=_hash_for, args=(1.0,))
    worker.start()
    capped = settle_threads(limit_s=0.05)
    worker.join()
    assert capped < 0.3  # a thread that stays busy holds the exit no longer than the limit


def test_settle_at_exit_registers_once_however_often_it_is_called():
    code = ("import perfora.distributed.exit_settle as e\n"
            "e.settle_threads = lambda: print('settled')\n"
            "e.settle_at_exit(); e.settle_at_exit(); e.settle_at_exit()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == ["settled"]  # once, at exit


def test_the_default_group_outlives_a_freed_ddp_wrapper_and_is_released_at_exit(tmp_path):
    # a DDP wrapper freed after destroy_process_group() (a model local to main()) must not
    # hold the group's last reference: its reducer would destroy the group while holding the
    # GIL, which can deadlock with a gloo thread that needs it. perfora keeps the group until
    # exit, then releases it from Python after gloo's threads settled
    code = f"""
import torch, torch.distributed as dist
from torch import nn
import perfora
import perfora.distributed.exit_settle as e
dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0,
                        world_size=1)
def main():
    model = perfora.perforate(nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1)))
    ddp = nn.parallel.DistributedDataParallel(model)
    perfora.GrowthController(ddp, write_files=False)
    e.settle_at_exit()  # what the controller calls on more than one rank
    ddp(torch.randn(4, 2)).sum().backward()
    group = dist.group.WORLD
    dist.barrier()
    dist.destroy_process_group()
    return [g is group for g in e._KEPT_GROUPS]
print("kept", main())
real = e._at_exit
e._at_exit = lambda: (real(), print("released", len(e._KEPT_GROUPS), flush=True))
import atexit; atexit.unregister(real); atexit.register(e._at_exit)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["kept [True]", "released 0"]
