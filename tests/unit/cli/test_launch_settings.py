"""`perfora launch` settings and commands, without starting anything: every bad value is a
ConfigError (exit 2 from the command line) naming the flag, and multi-node attempts use the
documented rendezvous and ports."""

from __future__ import annotations

import pytest

from perfora.cli import main
from perfora.cli.launch import PORT_WINDOW, LaunchSettings, init_command, torchrun_command
from perfora.errors import ConfigError


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


@pytest.mark.parametrize("settings,message", [
    ({"nproc_per_node": 0}, "--nproc-per-node must be a positive integer"),
    ({"nnodes": 0}, "--nnodes must be >= 1"),
    ({"nnodes": True}, "--nnodes must be an integer"),
    ({"nnodes": 2, "node_rank": 2, "master_addr": "10.0.0.1", "master_port": 29500},
     r"--node-rank must be in \[0, --nnodes=2\)"),
    ({"node_rank": -1}, r"--node-rank must be in \[0, --nnodes=1\)"),
    ({"nnodes": 2, "node_rank": 1}, "give --master-addr and --master-port"),
    ({"nnodes": 2, "master_addr": "10.0.0.1"}, "give --master-addr and --master-port"),
    ({"nnodes": 2, "master_port": 29500}, "give --master-addr and --master-port"),
    ({"nnodes": 2, "master_addr": "10.0.0.1", "master_port": 65536 - PORT_WINDOW + 1},
     "--master-port must be in"),
    ({"master_port": 0}, "--master-port must be in"),
    ({"max_failures": -1}, "--max-failures must be >= 0"),
    ({"max_restarts": -1}, "--max-restarts must be >= 0"),
    ({"attempt_timeout": 0}, "--attempt-timeout must be > 0"),
    ({"save_name": ""}, "--save-name must not be empty"),
    ({"script_args": ["--pai_load_folder=X"]}, "do not pass --pai_load_folder"),
    ({"script_args": ["--perforate_model_parallel"]}, "do not pass --perforate_model_parallel"),
])
def test_bad_settings_name_the_flag(script, settings, message):
    with pytest.raises(ConfigError, match=message):
        LaunchSettings(script=script, **settings)


def test_missing_script_is_named(tmp_path):
    with pytest.raises(ConfigError, match="training script .*nope.py.* not found"):
        LaunchSettings(script=str(tmp_path / "nope.py"))


@pytest.mark.parametrize("args,message", [
    (["--nnodes", "2", "--node-rank", "1"], "give --master-addr and --master-port"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "29500"],
     "--node-rank must be in"),
])
def test_command_line_multi_node_errors_exit_2_with_the_message(script, capsys, args, message):
    assert main(["launch", "--nproc-per-node", "2", *args, script]) == 2
    err = capsys.readouterr().err
    assert "perfora launch: error:" in err and message.split(" must")[0] in err


def test_single_node_attempts_are_standalone_with_no_torchrun_restarts(script):
    settings = LaunchSettings(script=script, script_args=["--lr", "1"], nproc_per_node=2,
                              save_name="RUN")
    cmd = torchrun_command(settings, attempt=3)
    assert "--standalone" in cmd and "--max-restarts=0" in cmd and "--nproc-per-node=2" in cmd
    assert cmd[-5:] == [script, "--lr", "1", "--pai_load_folder", "RUN"]
    assert init_command(settings)[-4:] == [script, "--lr", "1", "--perforate_model_parallel"]


def test_multi_node_attempt_n_uses_the_port_window_in_turn(script):
    settings = LaunchSettings(script=script, nnodes=2, node_rank=1, master_addr="10.0.0.1",
                              master_port=29500)

    def port(attempt: int) -> int:
        flag = next(a for a in torchrun_command(settings, attempt) if a.startswith("--master-port"))
        return int(flag.split("=")[1])

    assert [port(n) for n in (1, 2, PORT_WINDOW, PORT_WINDOW + 1)] == [
        29500, 29501, 29500 + PORT_WINDOW - 1, 29500]
    cmd = torchrun_command(settings, 1)
    assert {"--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1"} <= set(cmd)
    assert "--standalone" not in cmd
