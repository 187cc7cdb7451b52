"""`perfora launch`: 2 CPU ranks under torchrun, restarted after restructures and crashes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfora.cli import main
from perfora.cli.launch import (
    COMPLETE_MARKER,
    LaunchSettings,
    is_training_complete,
    mark_training_complete,
    newest_switch,
)
from perfora.errors import ConfigError
from tests.support.paths import ROOT, SCRIPTS

# the tests here share module-scoped runs: keep them on one pytest-xdist worker (a test
# that shares none gets a group of its own as well, so that xdist can balance the workers)
pytestmark = pytest.mark.xdist_group("test_launch")

ROOT = ROOT
LAUNCH_SCRIPTS = SCRIPTS / "launch"
NATIVE = LAUNCH_SCRIPTS / "native_train.py"
ONE_SET = ["--out", "res", "--max_dendrites", "1"]  # grow once (at epoch 3), complete at 6


def _launch(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **env)
    if "NATIVE_TRAIN_KILL" not in env:
        full_env.pop("NATIVE_TRAIN_KILL", None)
    return subprocess.run([sys.executable, "-m", "perfora.cli", "launch", *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=400)


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def _params(out: Path, rank: int) -> dict:
    return json.loads((out / f"params_rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One full run: --init, then 2 attempts (a restructure, then complete). Its script
    forgets the completion marker, as users' scripts do, so the launch writes it (the killed
    run below writes its own). (Restarts from the newest of several switch_N are
    test_launch_pai_script's.)"""
    cwd = tmp_path_factory.mktemp("uninterrupted")
    proc = _launch(["--nproc-per-node", "2", "--save-name", "RUN", "--init",
                    "--attempt-timeout", "150", str(NATIVE), *ONE_SET, "--forget_marker"], cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cwd, proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_restarts_after_each_restructure_until_training_complete(uninterrupted) -> None:
    cwd, stdout = uninterrupted
    events = _events(cwd / "res")
    assert events[0] == {"attempt": 0, "event": "init"}  # --init ran first, single process
    assert [(e["attempt"], e["event"], e.get("epoch"), e.get("dendrites")) for e in events[1:]] \
        == [(1, "start", 0, 0), (1, "restructured", 3, 1),
            (2, "start", 3, 1), (2, "complete", 6, 1)]
    assert is_training_complete(cwd / "RUN")
    assert newest_switch(cwd / "RUN") == 1
    rank0, rank1 = _params(cwd / "res", 0), _params(cwd / "res", 1)
    assert rank0["dendrites"] == 1 and rank0["epoch"] == 6
    assert rank0["params"] == rank1["params"]  # ranks identical, bit for bit
    # what happened is printed: each attempt, why it ended, the newest switch_N
    assert "attempt 1 ended: exit code 0 without .training_complete" in stdout
    assert "restarting (newest switch_N: switch_1)" in stdout
    assert "attempt 2: starting 2 rank(s), newest checkpoint switch_1" in stdout
    # the script forgot .training_complete: the launch wrote it and did not restart into
    # step() after completion
    assert "done: training complete after 2 attempt(s): the run's latest checkpoint says " \
        f"growth completed, but the script wrote no {COMPLETE_MARKER}, so the launch wrote " \
        "it" in stdout
    assert "attempt 3" not in stdout


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_rank_killed_mid_epoch_resumes_from_latest_and_matches_uninterrupted(
        uninterrupted, tmp_path: Path) -> None:
    proc = _launch(["--nproc-per-node", "2", "--save-name", "RUN", "--max-failures", "1",
                    "--attempt-timeout", "150", str(NATIVE), *ONE_SET], tmp_path,
                   NATIVE_TRAIN_KILL="1:2")  # rank 1, halfway through epoch 2, attempt 1
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "attempt 1 failed (exit code 1)" in proc.stdout
    assert "failure 1 of at most 1; restarting (newest switch_N: none)" in proc.stdout
    events = [(e["attempt"], e["event"], e.get("epoch")) for e in _events(tmp_path / "res")]
    # attempt 2 resumed after epoch 1 (from latest): only the epoch in progress was lost
    assert events == [(1, "start", 0), (2, "start", 1), (2, "restructured", 3),
                      (3, "start", 3), (3, "complete", 6)]
    assert is_training_complete(tmp_path / "RUN")  # written by the script itself
    assert "done: training complete after 3 attempt(s) (1 restart(s) after restructures, " \
        "1 failure(s)); newest switch_N: switch_1" in proc.stdout
    crashed = _params(tmp_path / "res", 0)
    assert crashed["params"] == _params(tmp_path / "res", 1)["params"]
    # resumed == uninterrupted: same weights as the run that was never killed
    assert crashed["params"] == _params(uninterrupted[0] / "res", 0)["params"]


@pytest.mark.xdist_group("too_many_failures")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_too_many_failures_stop_with_nonzero_exit_and_message(tmp_path: Path) -> None:
    proc = _launch(["--nproc-per-node", "2", "--max-failures", "1", "--attempt-timeout", "120",
                    str(LAUNCH_SCRIPTS / "fails.py")], tmp_path)
    assert proc.returncode == 1
    assert "deliberate failure" in proc.stderr  # the script's own error reaches the user
    assert "attempt 1 failed (exit code 1)" in proc.stdout
    assert "error: attempt 2 failed (exit code 1): that is 2 failed attempt(s), more than " \
        "--max-failures=1; giving up" in proc.stdout
    assert "attempt 3" not in proc.stdout


@pytest.mark.xdist_group("clean_exit")
@pytest.mark.timeout(200)
def test_clean_exit_without_progress_is_an_error_not_an_endless_loop(tmp_path: Path) -> None:
    proc = _launch(["--nproc-per-node", "1", "--save-name", "RUN", "--attempt-timeout", "120",
                    str(LAUNCH_SCRIPTS / "exits_without_progress.py")], tmp_path)
    assert proc.returncode == 1
    assert "attempt 1 exited 0 but wrote nothing to RUN/" in proc.stdout
    assert "save_name is 'RUN'" in proc.stdout
    assert "attempt 2" not in proc.stdout


def test_completed_folder_is_refused_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    mark_training_complete(tmp_path / "PAI")
    assert main(["launch", "--nproc-per-node", "2", str(NATIVE), "--out", "res"]) == 1
    out = capsys.readouterr().out
    assert f"error: PAI/{COMPLETE_MARKER} already exists" in out
    assert "attempt 1" not in out and not (tmp_path / "res").exists()


def test_bad_arguments_are_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["launch", "--nproc-per-node", "2", str(NATIVE), "--pai_load_folder", "X"]) == 2
    assert "do not pass --pai_load_folder to the script yourself" in capsys.readouterr().err
    assert main(["launch", "--nproc-per-node", "2", "missing.py"]) == 2
    assert "'missing.py' not found" in capsys.readouterr().err
    assert main(["launch", "--nproc-per-node", "0", str(NATIVE)]) == 2
    assert "--nproc-per-node must be a positive integer" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse: --nproc-per-node is required
        main(["launch", str(NATIVE)])
    assert exc.value.code == 2 and "required: --nproc-per-node" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # after the script it went to the script
        main(["launch", str(NATIVE), "--nproc-per-node", "2"])
    assert exc.value.code == 2
    assert "--nproc-per-node came after the script, so it went to the script: options for " \
        "perfora launch go before SCRIPT" in capsys.readouterr().err


def test_newest_switch_reads_both_checkpoint_formats(tmp_path: Path) -> None:
    assert newest_switch(tmp_path / "absent") is None
    for name in ("switch_2.pt", "switch_10.safetensors", "switch_x.pt", "switch_11.tmp",
                 "latest.pt"):
        (tmp_path / name).write_bytes(b"")
    assert newest_switch(tmp_path) == 10
    with pytest.raises(ConfigError, match="max-failures"):
        LaunchSettings(script=str(NATIVE), nproc_per_node=2, max_failures=-1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie waiting for its parent to reap it counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(") ")[-1].startswith("Z"))


@pytest.mark.xdist_group("hanging")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hanging_attempt_is_stopped_with_its_workers_and_counted_as_failure(
        tmp_path: Path) -> None:
    # the ranks import nothing heavy: each writes its pid well within the 5 s
    proc = _launch(["--nproc-per-node", "2", "--max-failures", "0", "--attempt-timeout", "5",
                    str(LAUNCH_SCRIPTS / "hangs.py"), "--pids", "pids"], tmp_path)
    assert proc.returncode == 1
    assert "error: attempt 1 timed out after 5 s: that is 1 failed attempt(s), more than " \
        "--max-failures=0" in proc.stdout
    pids = [int(p.read_text()) for p in sorted((tmp_path / "pids").glob("rank*.pid"))]
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)  # no orphaned rank left sleeping


@pytest.mark.timeout(120)
def test_an_init_run_that_needs_torchrun_says_why_it_failed(tmp_path: Path) -> None:
    # it said "fix the error printed above" after torch's "environment variable RANK
    # expected, but not set", without saying that --init runs outside torchrun
    script = tmp_path / "needs_torchrun.py"
    script.write_text("import torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n")
    proc = _launch(["--nproc-per-node", "2", "--save-name", "RUN", "--init", str(script)],
                   tmp_path)
    assert proc.returncode == 1
    assert "the initialization run (--perforate_model_parallel) failed" in proc.stdout
    assert "not under torchrun" in proc.stdout and "leave --init out" in proc.stdout
    assert "attempt 1" not in proc.stdout
