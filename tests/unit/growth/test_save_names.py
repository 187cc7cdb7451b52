"""``controller.save()`` mirrors ``load()``: a bare name is a checkpoint in ``run_dir`` (the docs'
``controller.save()`` raised TypeError, and ``save("latest")`` wrote ``./latest``); a run folder
given where one checkpoint belongs is named as such."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

import perfora


def _controller(run_dir=None, **settings) -> perfora.GrowthController:
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)))
    ctl = perfora.GrowthController(model, run_dir=run_dir, write_files=run_dir is not None,
                                   **settings)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    ctl.build_optimizer()
    return ctl


def test_save_writes_bare_names_in_the_run_folder_where_load_finds_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ctl = _controller(tmp_path / "run")
    ctl.step(0.5)
    assert ctl.save() == tmp_path / "run" / "latest.safetensors"
    assert ctl.save("final") == tmp_path / "run" / "final.safetensors"
    assert not (tmp_path / "final").exists() and not (tmp_path / "latest").exists()
    ctl.step(0.6)
    assert ctl.load("final").reason == "loaded final.safetensors" and ctl.epoch == 1
    assert ctl.save(tmp_path / "elsewhere.safetensors").exists()


@pytest.mark.parametrize("call", ["save", "load"])
def test_a_bare_name_without_a_run_folder_says_what_to_give(call):
    with pytest.raises(perfora.OrderError, match=r"no run_dir: give GrowthController\(\.\.\., "
                                                 r"run_dir=\.\.\.\) or pass a full path"):
        getattr(_controller(), call)("latest")


def test_a_run_folder_passed_as_a_checkpoint_is_named_with_its_checkpoints(tmp_path):
    ctl = _controller(tmp_path)
    ctl.step(0.5)
    ctl.save()
    assert "latest.safetensors" in os.listdir(tmp_path)
    with pytest.raises(perfora.CheckpointError, match="is a run folder, not one checkpoint: "
                                                      "pass one of its checkpoints"):
        perfora.resume(_controller().model, tmp_path)


def test_a_new_run_in_a_folder_holding_another_run_warns_and_a_resumed_one_does_not(tmp_path):
    first = _controller(tmp_path)
    first.step(0.5)
    first.save()
    again = _controller(tmp_path)
    with pytest.warns(UserWarning, match=r"already holds another run's files \(best.*"
                                         r"resume that run: controller\.load\('latest'\)"):
        again.step(0.5)
    resumed = _controller(tmp_path)
    resumed.load("latest")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.step(0.6)


def test_a_new_run_over_a_folder_with_only_metrics_warns_too(tmp_path):
    first = _controller(tmp_path, save_checkpoints=False)  # as the Lightning callback writes
    first.step(0.5)
    assert (tmp_path / "metrics.csv").is_file() and not list(tmp_path.glob("*.safetensors"))
    again = _controller(tmp_path, save_checkpoints=False)
    with pytest.warns(UserWarning, match=r"already holds another run's files \(metrics\.csv\)"):
        again.step(0.5)
