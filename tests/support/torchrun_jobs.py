"""Start a script on 2 CPU ranks under torchrun and read each rank's result_<rank>.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def launch(script: Path, out: Path, *extra: str) -> subprocess.Popen:
    """``torchrun --standalone --nproc-per-node 2 script out *extra``, output captured."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script), str(out), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)


def results(out: Path, proc: subprocess.Popen, timeout: float = 240) -> list[dict]:
    """Wait for the job (killing it on timeout); it must exit 0; both ranks' results."""
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, log[-3000:]
    return [json.loads((out / f"result_{rank}.json").read_text()) for rank in range(2)]
