"""benchmarks/quality.py's command line: ``--set`` runs the arm it defines, and a harness
score it does not know is an error of the command line, not a run that maximizes the loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.script_server import ScriptRun, ScriptServer

pytest.importorskip("sklearn")


@pytest.fixture
def quality(script_server: ScriptServer, tmp_path: Path):
    """``python benchmarks/quality.py ARGS``, forked from the warm script server."""
    def run(*args: str) -> ScriptRun:
        return script_server.run(ROOT / "benchmarks" / "quality.py", *args,
                                 cwd=tmp_path / "job", timeout=240)
    return run


@pytest.mark.timeout(300)
def test_set_runs_its_custom_arm_beside_the_selected_ones(quality, tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    proc = quality("--quick", "--datasets", "wine", "--no-curve", "--seeds", "1", "--jobs",
                    "1", "--arms", "default", "--set", "grow_fraction=0.5", "--json", str(out),
                    "--out-dir", str(tmp_path))
    assert proc.ok, proc.log()
    assert "--set defines the arm 'custom': running it" in proc.log()
    saved = json.loads(out.read_text())
    assert saved["setup"]["arms"] == {"default": {}, "custom": {"grow_fraction": 0.5}}
    assert sorted({run["name"] for run in saved["runs"]}) == ["custom", "default"]


def test_an_unknown_harness_score_is_refused(quality) -> None:
    proc = quality("--arms", "custom", "--set", "score=val_acc", "--no-curve")
    assert proc.codes == [2]
    assert "score='val_acc': the harness scores val_loss, train_loss" in proc.log()
