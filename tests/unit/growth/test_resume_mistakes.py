"""A resume gone wrong in the ways a user gets it wrong: each one is refused or said out loud,
never silently carried on."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import perfora
from perfora.growth.report import read_metrics


def _build(width: int = 8) -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))


def _run(tmp_path: Path, widen_by: int = 0) -> perfora.GrowthController:
    torch.manual_seed(0)
    model = perfora.perforate(_build())
    if widen_by:
        perfora.widen(model, 0, widen_by)
    ctl = perfora.GrowthController(model, seed=0, n_epochs_to_switch=2, max_dendrites=2,
                                   run_dir=tmp_path, checkpoint_time_budget=None)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-2)
    ctl.build_optimizer()
    for score in [0.5, 0.5, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7]:
        ctl.step(score)
    assert ctl.num_dendrites == 2 and ctl.epoch == 8
    return ctl


def test_a_flipped_maximize_is_refused_on_resume_and_on_load(tmp_path: Path) -> None:
    _run(tmp_path)
    fresh = _build()
    with pytest.raises(perfora.ConfigError, match=r"maximize=True.*maximize=False"):
        perfora.resume(fresh, tmp_path / "latest.safetensors", maximize=False)
    assert perfora.dendritic_layers(fresh) == {}  # refused before the model was converted
    ctl = perfora.GrowthController(perfora.perforate(_build()), maximize=False,
                                   run_dir=tmp_path)
    with pytest.raises(perfora.ConfigError, match="read the other way round"):
        ctl.load("latest")
    assert ctl.num_dendrites == 0 and ctl.epoch == 0
    same = perfora.resume(_build(), tmp_path / "latest.safetensors", maximize=True)
    assert same.epoch == 8


def _registered(tmp_path: Path, before_load: bool) -> perfora.GrowthController:
    ctl = perfora.GrowthController(perfora.perforate(_build()), run_dir=tmp_path)
    if before_load:
        ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
        ctl.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctl.load("latest")
        if not before_load:
            ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
            ctl.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=3)
            ctl.build_optimizer()
    return ctl


def _trained_run(tmp_path: Path) -> None:
    """A run whose optimizer has moments and whose scheduler has stepped, saved as latest."""
    ctl = _run(tmp_path)
    ctl.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=3)
    model, optimizer, scheduler = ctl.model, *ctl.build_optimizer()
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(16, 4)).square().mean().backward()
        optimizer.step()
        scheduler.step()
    ctl.save("latest")


def test_an_optimizer_registered_after_the_load_gets_the_saved_state(tmp_path: Path) -> None:
    _trained_run(tmp_path)
    before, after = _registered(tmp_path, True), _registered(tmp_path, False)
    saved, restored = before.optimizer.state_dict(), after.optimizer.state_dict()
    assert restored["param_groups"] == saved["param_groups"]
    assert restored["param_groups"][0]["lr"] == 1e-2  # the run's, not the 1e-3 given now
    assert len(restored["state"]) == len(saved["state"]) > 0
    for index, moments in saved["state"].items():
        for key, value in moments.items():
            assert torch.equal(restored["state"][index][key], value), (index, key)
    assert after.scheduler.state_dict() == before.scheduler.state_dict()
    rebuilt = after.build_optimizer()[0]  # only the first build after the load restores
    assert rebuilt.state_dict()["state"] == {}


def test_a_saved_optimizer_state_that_cannot_be_restored_is_said(tmp_path: Path) -> None:
    _trained_run(tmp_path)
    ctl = perfora.GrowthController(perfora.perforate(_build()), run_dir=tmp_path)
    ctl.load("latest")
    with pytest.warns(UserWarning, match="set_optimizer_instance is the user's to restore"):
        ctl.set_optimizer_instance(torch.optim.Adam(ctl.model.parameters()))
    owned = perfora.GrowthController(perfora.perforate(_build()), run_dir=tmp_path)
    owned.set_optimizer_instance(torch.optim.Adam(owned.model.parameters()))
    with pytest.warns(UserWarning, match="did not restore into the optimizer registered"):
        owned.load("latest")
    sgd = perfora.GrowthController(perfora.perforate(_build()), run_dir=tmp_path)
    sgd.load("latest")
    sgd.set_optimizer(torch.optim.SGD, lr=0.1, momentum=0.9)
    with pytest.raises(perfora.CheckpointError, match="does not fit the optimizer"):
        sgd.build_optimizer()


def test_a_model_of_another_width_raises_shape_mismatch(tmp_path: Path) -> None:
    _run(tmp_path)
    with pytest.raises(perfora.ShapeMismatchError, match="has 12 neurons here but 8"):
        perfora.resume(_build(12), tmp_path / "latest.safetensors")


def test_the_width_message_names_the_start_of_a_run_that_grew_neurons(tmp_path: Path) -> None:
    _run(tmp_path, widen_by=4)
    with pytest.raises(perfora.ShapeMismatchError,
                       match=r"built with 12 neurons here, but the saved run started from 8 "
                             r"\(and grew 4 more\)"):
        perfora.resume(_build(12), tmp_path / "latest.safetensors")
    assert perfora.resume(_build(8), tmp_path / "latest.safetensors").epoch == 8


def test_resuming_an_earlier_checkpoint_keeps_the_later_metrics_rows(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _run(tmp_path)
    before = (tmp_path / "metrics.csv").read_text()
    with caplog.at_level(logging.WARNING, logger="perfora"):
        resumed = perfora.resume(_build(), tmp_path / "switch_1.safetensors")
    kept = tmp_path / "metrics.until-epoch-8.csv"
    assert kept.read_text() == before
    assert "kept in metrics.until-epoch-8.csv" in caplog.text
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["epoch"] for r in rows] == list(range(1, resumed.epoch + 1))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="perfora"):
        perfora.resume(_build(), tmp_path / "latest.safetensors")
    assert "metrics.until-epoch" not in caplog.text  # nothing cut: nothing to keep


def test_a_run_folder_or_a_csv_given_as_the_checkpoint_says_what_it_is(tmp_path: Path) -> None:
    _run(tmp_path)
    with pytest.raises(perfora.CheckpointError,
                       match=r"is a folder, not a checkpoint file; pass one of the "
                             r"checkpoints in it: best\.safetensors, latest\.safetensors"):
        perfora.load_model(_build(), tmp_path)
    with pytest.raises(perfora.CheckpointError, match="is not a safetensors file"):
        perfora.load_model(_build(), tmp_path / "metrics.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(perfora.CheckpointError, match="folder with no checkpoint in it"):
        perfora.load_model(_build(), tmp_path / "empty")
