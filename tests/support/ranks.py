"""Run a function on N real CPU ranks (gloo, FileStore, spawned processes); collect their JSON.

Like ``run_ranks`` of tests/integration/parallel/test_ddp.py, with the world size a
parameter (a run saved on 2 ranks is resumed on 1 and 3). Each job gets its own folder for
the store and the results, and a join deadline, so a hang fails the test.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, fn: Callable, job: str, world: int, args: tuple) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(job, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        result = fn(rank, world, *args)
        Path(job, f"result_{rank}.json").write_text(json.dumps(result))
        dist.barrier()
        Path(job, f"done_{rank}").touch()
    finally:
        dist.destroy_process_group()


def run_world(fn: Callable, job: Path, world: int, *args, join_s: float = 120) -> list:
    """``fn(rank, world, *args)`` on ``world`` gloo ranks; each rank's JSON-able result.

    ``job`` is a fresh folder for this job's store and results (not the data folder)."""
    job.mkdir(parents=True, exist_ok=False)
    ctx = mp.start_processes(_entry, args=(fn, str(job), world, args), nprocs=world,
                             join=False, start_method="spawn")
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
