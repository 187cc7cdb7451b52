"""`perfora launch` forks torchrun's agent from the launcher: exit codes, environment, timeouts."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from perfora.cli.forked_agent import ForkedAgent, can_fork_agent
from perfora.cli.launch import LaunchSettings, _run, torchrun_command

# the workers are plain Python scripts (no torch import): the agent is what is tested
WORKER = """
import os, sys, time
rank = int(os.environ["RANK"])
with open(f"rank{rank}.txt", "w") as f:
    f.write(f"{os.getpid()} {os.environ.get('AGENT_TEST_VALUE')} {os.environ['WORLD_SIZE']}")
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
    code, timed_out = _run(_command(tmp_path, "ok"), _env(AGENT_TEST_VALUE="seen"), 100)
    assert (code, timed_out) == (0, False)
    ranks = [(tmp_path / f"rank{r}.txt").read_text().split() for r in (0, 1)]
    assert [r[1:] for r in ranks] == [["seen", "2"], ["seen", "2"]]
    assert os.environ.get("AGENT_TEST_VALUE") is None  # the launcher's own environment


@pytest.mark.timeout(120)
def test_a_failed_rank_makes_the_attempt_fail(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, timed_out = _run(_command(tmp_path, "fail"), _env(), 100)
    assert code == 1 and not timed_out  # torchrun's exit code for a failed worker


@pytest.mark.timeout(120)
def test_an_attempt_past_its_timeout_is_stopped_with_its_ranks(tmp_path: Path,
                                                              monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    code, timed_out = _run(_command(tmp_path, "sleep"), _env(), 4)
    assert timed_out and code != 0 and time.monotonic() - start < 60
    for rank in (0, 1):
        pid = int((tmp_path / f"rank{rank}.txt").read_text().split()[0])
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # no rank left sleeping


@pytest.mark.timeout(60)
def test_bad_torchrun_arguments_exit_2_as_the_fresh_process_did() -> None:
    agent = ForkedAgent([sys.executable, "-m", "torch.distributed.run", "--no-such-flag",
                         "x.py"], _env())
    assert agent.wait(timeout=30) == 2  # argparse's usage error
