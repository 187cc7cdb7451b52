"""`perfora launch` forks torchrun's agent from the launcher: exit codes, environment, timeouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfora.cli.forked_agent import ForkedAgent, can_fork_agent
from perfora.cli.launch import LaunchSettings, _stop_group, torchrun_command
from tests.support.paths import ROOT

# the workers are plain Python scripts (no torch import): the agent is what is tested; each
# writes its pid, the launch's variable, the world size and its agent's command line
WORKER = """
import os, sys, time
rank = int(os.environ["RANK"])
with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
    agent = f.read().replace(b"\\0", b" ").decode()
with open(f"rank{rank}.txt", "w") as f:
    f.write(f"{os.getpid()}|{os.environ.get('AGENT_TEST_VALUE')}|{os.environ['WORLD_SIZE']}|{agent}")
if sys.argv[1] == "fail" and rank == 1:
    sys.exit(3)
if sys.argv[1] == "sleep":
    time.sleep(120)
"""


def _command(tmp_path: Path, mode: str) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    settings = LaunchSettings(script=str(script), script_args=[mode], nproc_per_node=2)
    return torchrun_command(settings)[:-2]  # without --pai_load_folder: not the restart loop


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", **extra)


def _ranks(folder: Path) -> list[list[str]]:
    return [(folder / f"rank{r}.txt").read_text().split("|") for r in (0, 1)]


def test_only_torchrun_under_this_interpreter_is_forked() -> None:
    assert can_fork_agent([sys.executable, "-m", "torch.distributed.run", "train.py"])
    assert not can_fork_agent(["/other/python", "-m", "torch.distributed.run", "train.py"])
    assert not can_fork_agent([sys.executable, "train.py", "--perforate_model_parallel"])
    with pytest.raises(ValueError, match="not a torchrun command"):
        ForkedAgent([sys.executable, "train.py"], _env())


@pytest.mark.timeout(120)
def test_the_forked_agent_runs_the_ranks_with_the_launch_environment(tmp_path: Path,
                                                                   monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    agent = ForkedAgent(_command(tmp_path, "ok"), _env(AGENT_TEST_VALUE="seen"))
    assert agent.wait(timeout=100) == 0
    ranks = _ranks(tmp_path)
    assert [r[1:3] for r in ranks] == [["seen", "2"], ["seen", "2"]]
    assert "torch.distributed.run" not in ranks[0][3]  # a fork of this process, not a new one
    assert os.environ.get("AGENT_TEST_VALUE") is None  # the launcher's own environment


@pytest.mark.timeout(120)
def test_a_failed_rank_makes_the_attempt_fail(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    agent = ForkedAgent(_command(tmp_path, "fail"), _env())
    assert agent.wait(timeout=100) == 1  # torchrun's exit code for a failed worker


@pytest.mark.timeout(120)
def test_an_attempt_past_its_timeout_is_stopped_with_its_ranks(tmp_path: Path,
                                                              monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    agent = ForkedAgent(_command(tmp_path, "sleep"), _env())
    with pytest.raises(subprocess.TimeoutExpired):
        agent.wait(timeout=4)
    start = time.monotonic()
    _stop_group(agent)  # what the launch does on --attempt-timeout
    assert agent.returncode not in (None, 0) and time.monotonic() - start < 60
    for rank in _ranks(tmp_path):
        with pytest.raises(ProcessLookupError):
            os.kill(int(rank[0]), 0)  # no rank left sleeping


@pytest.mark.timeout(60)
def test_bad_torchrun_arguments_exit_2_as_the_fresh_process_did() -> None:
    agent = ForkedAgent([sys.executable, "-m", "torch.distributed.run", "--no-such-flag",
                         "x.py"], _env())
    assert agent.wait(timeout=30) == 2  # argparse's usage error


@pytest.mark.timeout(120)
def test_a_launcher_running_other_threads_starts_torchrun_as_a_new_process(tmp_path) -> None:
    # a fork copies locks that other threads may hold: with a thread running, the launch
    # starts `python -m torch.distributed.run` as before; alone, it forks
    (tmp_path / "worker.py").write_text(WORKER)
    probe = """
import json, os, sys, threading
from perfora.cli.launch import LaunchSettings, _run, torchrun_command
cmd = torchrun_command(LaunchSettings(script="worker.py", script_args=["ok"],
                                      nproc_per_node=2))[:-2]
if sys.argv[1] == "thread":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
print(json.dumps(_run(cmd, dict(os.environ), 100)))
"""
    agents = {}
    for mode in ("alone", "thread"):
        proc = subprocess.run([sys.executable, "-c", probe, mode], cwd=tmp_path,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                              text=True, timeout=100)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.splitlines()[-1]) == [0, False]
        agents[mode] = _ranks(tmp_path)[0][3]
    assert "torch.distributed.run" not in agents["alone"]
    assert "-m torch.distributed.run" in agents["thread"]
