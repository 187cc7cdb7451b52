"""Run a function on N real CPU ranks (gloo, FileStore, fresh processes); collect their JSON.

Each job gets its own folder for the store and the results, and a join deadline, so a hang
fails the test. The ranks are forked from a forkserver that has imported torch, perfora and
the calling test module once per pytest worker (spawning imported them again for every job,
which cost more than most jobs' work), and a rank that finished leaves with ``os._exit``
after the final barrier instead of tearing the group and the interpreter down.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# torch._dynamo: torch imports it when the first optimizer is built (~1.5 s per process)
PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.distributed.fsdp",
           "torch.distributed.checkpoint", "torch.distributed.tensor", "perfora"]


def _entry(rank: int, fn: Callable, job: str, world: int, args: tuple, pass_folder: bool) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(job, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        result = fn(rank, Path(job) if pass_folder else world, *args)
        Path(job, f"result_{rank}.json").write_text(json.dumps(result))
        dist.barrier()
        Path(job, f"done_{rank}").touch()  # every rank finished its work and its results
    except BaseException:
        dist.destroy_process_group()
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    # results are written and every rank passed the barrier: leave without tearing down the
    # group or the interpreter (slow, and gloo's teardown can wait on a peer that is gone)
    os._exit(0)


def _start_method(fn: Callable) -> str:
    """forkserver, preloaded with the heavy imports and ``fn``'s module on first use."""
    # The preload list is read when this pytest worker's forkserver starts (its first job), so
    # it is set before every job, whatever the worker ran before: a check of the global start
    # method here once left the forkserver of whichever worker had started another process
    # first without the preload, and each of its ranks imported torch again (~8 s a job).
    multiprocessing.set_forkserver_preload([*PRELOAD, fn.__module__])
    return "forkserver"


def _launch(fn: Callable, job: Path, world: int, args: tuple, pass_folder: bool,
            join_s: float) -> list:
    ctx = mp.start_processes(_entry, args=(fn, str(job), world, args, pass_folder),
                             nprocs=world, join=False, start_method=_start_method(fn))
    deadline = time.monotonic() + join_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not finish within {join_s} s (hang?)")
    except mp.ProcessExitedException:
        # gloo may abort a process while it tears down, after every rank passed the final
        # barrier; a crash before that point still fails the test
        if not all(Path(job, f"done_{r}").exists() for r in range(world)):
            raise
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [json.loads(Path(job, f"result_{r}.json").read_text()) for r in range(world)]


def run_world(fn: Callable, job: Path, world: int, *args, join_s: float = 120) -> list:
    """``fn(rank, world, *args)`` on ``world`` gloo ranks; each rank's JSON-able result.

    ``job`` is a fresh folder for this job's store and results (not the data folder)."""
    job.mkdir(parents=True, exist_ok=False)
    return _launch(fn, job, world, args, pass_folder=False, join_s=join_s)


def run_in_folder(fn: Callable, folder: Path, world: int, *args, join_s: float = 90) -> list:
    """``fn(rank, folder, *args)`` on ``world`` gloo ranks, with the store and the results in
    ``folder`` (the data folder, reused by later jobs: its old results are removed first)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("result_*.json"), *folder.glob("done_*"), *folder.glob("store")]:
        old.unlink()
    return _launch(fn, folder, world, args, pass_folder=True, join_s=join_s)


def wrapped_for(kind: str, model: torch.nn.Module, world: int) -> torch.nn.Module:
    """``model`` under ``kind`` on this rank: "ddp" (DistributedDataParallel), "fsdp1"
    (``perfora.parallel.wrap_fsdp1`` on the CPU) or "fsdp2" (``shard_fsdp2`` over a CPU
    mesh of ``world`` ranks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel

    from perfora.parallel import shard_fsdp2, wrap_fsdp1

    if kind == "ddp":
        return DistributedDataParallel(model)
    if kind == "fsdp1":
        return wrap_fsdp1(model, device_id=torch.device("cpu"))
    return shard_fsdp2(model, mesh=init_device_mesh("cpu", (world,)))
