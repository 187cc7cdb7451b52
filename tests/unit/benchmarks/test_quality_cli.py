"""benchmarks/quality.py's command line: ``--set`` runs the arm it defines, and a harness
score it does not know is an error of the command line, not a run that maximizes the loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytest.importorskip("sklearn")


def _quality(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quality.py"), *args],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"))


@pytest.mark.timeout(300)
def test_set_runs_its_custom_arm_beside_the_selected_ones(tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    proc = _quality("--quick", "--datasets", "wine", "--no-curve", "--seeds", "1", "--jobs",
                    "1", "--arms", "default", "--set", "grow_fraction=0.5", "--json", str(out),
                    "--out-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "--set defines the arm 'custom': running it" in proc.stderr
    saved = json.loads(out.read_text())
    assert saved["setup"]["arms"] == {"default": {}, "custom": {"grow_fraction": 0.5}}
    assert sorted({run["name"] for run in saved["runs"]}) == ["custom", "default"]


def test_an_unknown_harness_score_is_refused() -> None:
    proc = _quality("--arms", "custom", "--set", "score=val_acc", "--no-curve")
    assert proc.returncode == 2
    assert "score='val_acc': the harness scores val_loss, train_loss" in proc.stderr
