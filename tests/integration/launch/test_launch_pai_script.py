"""The PerforatedAI multi-GPU (DDP) recipe, followed literally (GPA/UPA names), run through
`perfora launch`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT, SCRIPTS

ROOT = ROOT
PAI_SCRIPT = SCRIPTS / "launch" / "pai_ddp_train.py"


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_pai_ddp_script_runs_through_launch_init_restarts_and_completes(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "perfora.cli", "launch", "--nproc-per-node", "2", "--init",
         "--attempt-timeout", "150", str(PAI_SCRIPT), "--out", "res"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    # the initialization run: one batch, settings saved, exit 0
    assert "Initialization complete. Now run without --perforate_model_parallel" in out
    assert (tmp_path / "PAI" / "pai_tracker_settings.json").is_file()
    # attempt 1 starts fresh; each later attempt loads the newest switch_N the last one wrote
    assert "Starting from beginning (no switch_x.pt files found in PAI)" in out
    assert out.count("Loaded PAI state from PAI/switch_1.pt") == 2  # both ranks, attempt 2
    assert out.count("Loaded PAI state from PAI/switch_2.pt") == 2  # both ranks, attempt 3
    assert "rank 1: restructured after epoch 3, exiting to restart" in out
    assert "done: training complete after 3 attempt(s) (2 restart(s) after restructures, " \
        "0 failure(s)); newest switch_N: switch_2" in out
    assert (tmp_path / "PAI" / ".training_complete").is_file()
    assert not list((tmp_path / "PAI").glob("switch_3*"))
    rank0, rank1 = (json.loads((tmp_path / "res" / f"params_rank{r}.json").read_text())
                    for r in (0, 1))
    assert rank0["dendrites"] == 2 and rank0["epoch"] == 9
    assert rank0["params"] == rank1["params"]  # ranks identical, bit for bit
