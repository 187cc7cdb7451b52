"""Scripts written for the PerforatedAI API, following PerforatedAI's recipes literally, run on
perfora with only the two imports swapped (tests/scripts/compat/), each run in a process of
its own (forked from the warm script server, as ``python script.py`` runs it).

Single process to training_complete; the multi-GPU recipe's restart workflow (exit after each
restructure, reload the highest switch_N) giving the same model as an uninterrupted run;
DataParallel with the --perforate_model_parallel initialization run (test_compat.py
covers DataParallel without it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from perfora import dendritic_layers
from perfora.compat import globals_perforatedai as GPA
from perfora.compat import utils_perforatedai as UPA
from perfora.compat.tracker import COMPLETE_MARKER, SETTINGS_FILE
from tests.support.paths import SCRIPTS
from tests.support.script_server import ScriptServer

SCRIPTS = SCRIPTS / "compat"
TIMEOUT = 120


@pytest.fixture
def run(script_server: ScriptServer):
    """Run a compat script (stdin closed: nothing may prompt); it must exit 0; returns its
    output and the last JSON line it printed."""

    def run_script(script: str, cwd: Path, *args: str) -> tuple[str, dict | None]:
        done = script_server.run(SCRIPTS / script, *args, cwd=cwd, timeout=TIMEOUT)
        out = done.log()
        assert done.ok, out
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        return out, json.loads(lines[-1]) if lines else None

    return run_script


def assert_safetensors(path: Path) -> None:
    with safe_open(str(path), framework="pt") as handle:
        assert any(k.startswith("model/") for k in handle.keys()), path


def build_like_scripts() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))


def reload_best(folder: Path, probe_seed: int) -> torch.Tensor:
    """A fresh model, perforated and loaded with PerforatedAI's calls: outputs on the probe."""
    GPA.reset()
    GPA.pc.set_testing_dendrite_capacity(False)
    try:
        model = UPA.perforate_model(build_like_scripts(), save_name=str(folder / "reload"))
        model = UPA.load_system(model, str(folder), "best_model", True)
        gen = torch.Generator().manual_seed(probe_seed)
        torch.randn(384, 8, generator=gen)  # the scripts draw the data first, then the probe
        probe = torch.randn(16, 8, generator=gen)
        with torch.no_grad():
            return model(probe), {layer.num_dendrites
                                  for layer in dendritic_layers(model).values()}
    finally:
        GPA.reset()


@pytest.mark.timeout(300)
def test_single_process_script_reaches_complete_and_restart_workflow_matches(tmp_path, run):
    _, result = run("pai_single.py", tmp_path, "--save_name", "RUN")
    assert result["complete"] and result["restructures"] >= 1
    folder = tmp_path / "RUN"
    switches = sorted(folder.glob("switch_*.pt"))
    assert len(switches) == result["restructures"]
    for path in [*switches, folder / "best_model.pt", folder / "latest.pt"]:
        assert_safetensors(path)
    assert (folder / COMPLETE_MARKER).is_file()
    final = load_file(str(folder / "final_outputs.safetensors"))["out"]
    reloaded, dendrites = reload_best(folder, probe_seed=1)
    assert torch.equal(reloaded, final) and dendrites == {result["dendrites"]}

    # the multi-GPU recipe's restart workflow: exit after each restructure, restart from the highest
    # switch_N (what `perfora launch` automates), until the marker file appears
    attempts, args = 0, ["--save_name", "RST", "--exit_on_restructure"]
    while not (tmp_path / "RST" / COMPLETE_MARKER).exists():
        attempts += 1
        assert attempts <= 6, "the restart workflow did not finish"
        out, _ = run("pai_single.py", tmp_path, *args)
        if attempts > 1:
            assert "Loaded PAI state from RST/switch_" in out
        args = ["--save_name", "RST", "--exit_on_restructure", "--pai_load_folder", "RST"]
    assert attempts == result["restructures"] + 1
    resumed = load_file(str(tmp_path / "RST" / "final_outputs.safetensors"))["out"]
    assert torch.equal(resumed, final)  # resumed == uninterrupted, bit for bit


@pytest.mark.timeout(300)
def test_dataparallel_two_step_recipe(tmp_path, run):
    out, _ = run("pai_dataparallel.py", tmp_path, "--save_name", "DP",
                 "--perforate_model_parallel")
    assert "Initialization complete" in out
    folder = tmp_path / "DP"
    saved = json.loads((folder / SETTINGS_FILE).read_text())
    assert saved["settings"]["switch_mode"] == GPA.pc.DOING_FIXED_SWITCH
    assert saved["settings"]["fixed_switch_num"] == 3
    assert saved["layers"] == {"0": {"neurons": 6, "dendrites": 0},
                               "2": {"neurons": 3, "dendrites": 0}}
    assert not list(folder.glob("*.pt"))  # it stopped after the first batch

    out, result = run("pai_dataparallel.py", tmp_path, "--save_name", "DP")
    assert result["complete"] and result["restructures"] >= 1
    assert result["wrapper"] == "DataParallel"
    assert "settings changed" not in out
    assert (folder / COMPLETE_MARKER).is_file()
    for path in [*folder.glob("switch_*.pt"), folder / "best_model.pt", folder / "latest.pt"]:
        assert_safetensors(path)
    final = load_file(str(folder / "final_outputs.safetensors"))["out"]
    reloaded, dendrites = reload_best(folder, probe_seed=2)
    assert torch.equal(reloaded, final) and dendrites == {result["dendrites"]}
