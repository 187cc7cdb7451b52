"""DendriteGrowth warns where a fit would silently do the wrong thing, and says what it grew
(real CPU Trainers).

A monitor named like a loss with mode='max' (or an accuracy with mode='min') keeps the worst
model as the best; a fit without validation never reads the monitor, so nothing grows. Each
growth step and the completion are announced on Lightning's info log.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from perfora import ConfigError, dendritic_layers
from perfora.integrations.lightning import DendriteGrowth
from tests.support.paths import SCRIPTS

sys.path.insert(0, str(SCRIPTS / "lightning"))
from run_digits import DigitsNet, digits_loaders  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def fit(tmp_path: Path, growth: DendriteGrowth, val: bool = True, max_epochs: int = 1,
        extra: list[pl.Callback] = (), ckpt_path: str | None = None, **kw) -> pl.Trainer:
    """One short single-device CPU fit of the digits MLP (about a second per epoch)."""
    torch.manual_seed(0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False,
                         enable_checkpointing=any(isinstance(c, pl.callbacks.ModelCheckpoint)
                                                  for c in extra),
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=str(tmp_path),
                         callbacks=[growth, *extra], **kw)
    train, val_loader = digits_loaders(200)
    trainer.fit(DigitsNet(), train, val_loader if val else None, ckpt_path=ckpt_path)
    return trainer


def ours(record: list[warnings.WarningMessage]) -> list[str]:
    """The callback's warnings among those recorded."""
    return [str(w.message) for w in record if "DendriteGrowth(monitor=" in str(w.message)]


@pytest.mark.parametrize("monitor,mode,better", [("val_loss", "max", "min"),
                                                 ("val_acc", "min", "max")])
def test_a_direction_that_restores_the_worst_model_warns_at_setup(tmp_path, monitor, mode,
                                                                  better):
    growth = DendriteGrowth(monitor=monitor, mode=mode, module="net")
    with pytest.warns(UserWarning, match=rf"mode={better!r} is usual.*worst model") as record:
        fit(tmp_path, growth)
    assert len(ours(record)) == 1  # once, at setup; the fit itself went on
    assert growth.controller is not None and growth.controller.epoch == 1


@pytest.mark.parametrize("monitor,mode", [("val_loss", "min"), ("val_acc", "max")])
def test_the_usual_direction_does_not_warn(tmp_path, monitor, mode):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fit(tmp_path, DendriteGrowth(monitor=monitor, mode=mode, module="net"))
    assert ours(record) == []


def test_two_growth_callbacks_on_one_trainer_are_refused_before_anything_grows(tmp_path):
    first = DendriteGrowth(monitor="val_loss", mode="min", module="net")
    second = DendriteGrowth(monitor="val_acc", mode="max", module="net")
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         default_root_dir=str(tmp_path), callbacks=[first, second])
    train, val_loader = digits_loaders(200)
    model = DigitsNet()
    with pytest.raises(ConfigError, match="more than one DendriteGrowth callback"):
        trainer.fit(model, train, val_loader)
    assert not dendritic_layers(model)  # not perforated


def test_a_fit_without_validation_warns_that_nothing_can_grow(tmp_path):
    growth = DendriteGrowth(monitor="val_acc", mode="max", module="net", switch_mode="fixed",
                            fixed_switch_num=1)
    expected = (r"monitor='val_acc'\): no validation ran by the end of epoch 0.*"
                r"no dendrites will grow \(metrics logged so far: \['train_loss'\]\)")
    with pytest.warns(UserWarning, match=expected) as record:
        fit(tmp_path, growth, val=False, max_epochs=2)
    assert len(ours(record)) == 1  # once per fit, not every epoch
    assert growth.controller.epoch == 0 and growth.controller.num_dendrites == 0


def test_limit_val_batches_zero_warns_too_and_a_late_first_validation_does_not(tmp_path):
    growth = DendriteGrowth(monitor="val_acc", mode="max", module="net")
    with pytest.warns(UserWarning, match="keep limit_val_batches above 0"):
        fit(tmp_path / "a", growth, limit_val_batches=0)
    # validation every 2nd epoch: the first epoch has none, and that is no reason to warn
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fit(tmp_path / "b", growth, max_epochs=2, check_val_every_n_epoch=2)
    assert ours(record) == [] and growth.controller.epoch == 1


class Lines(logging.Handler):
    """Keeps the messages of Lightning's rank-zero info log."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("verbose,rule", [(True, "gd"), (False, "gd"), (True, "correlation")])
def test_each_growth_step_and_the_completion_are_announced(tmp_path, verbose, rule):
    log, lines = logging.getLogger("lightning.pytorch"), Lines()
    log.addHandler(lines)
    try:
        growth = DendriteGrowth(monitor="val_acc", mode="max", module="net", rule=rule,
                                switch_mode="fixed", fixed_switch_num=1, max_dendrites=1,
                                growth="dendrites", verbose=verbose)
        fit(tmp_path, growth, max_epochs=4)
    finally:
        log.removeHandler(lines)
    ours = [line for line in lines.lines if line.startswith("DendriteGrowth:")]
    if not verbose:
        assert ours == []
        return
    history = growth.controller.state.history
    said = [row for row in history if row["event"]]  # the rows that changed something
    assert len(ours) == len(said) >= 2
    assert ours == [f"DendriteGrowth: epoch {row['epoch'] - 1}: {row['reason']}" for row in said]
    assert ("phase_change" in [row["event"] for row in said]) == (rule == "correlation")
    assert ours[0] == f"DendriteGrowth: epoch 0: {said[0]['reason']}"
    assert "added dendrite set 1" in ours[0] and said[-1]["event"] == "complete"


@pytest.mark.parametrize("patience,warns", [(2, True), (3, False)])
def test_an_early_stopping_no_more_patient_than_growth_warns_at_setup(tmp_path, patience,
                                                                      warns):
    # it stopped the fit at the plateau that would have grown the model, silently
    from lightning.pytorch.callbacks import EarlyStopping

    growth = DendriteGrowth(monitor="val_acc", mode="max", module="net", patience=2)
    stopper = EarlyStopping(monitor="val_acc", mode="max", patience=patience)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fit(tmp_path, growth, extra=[stopper])
    said = [str(w.message) for w in record if "EarlyStopping(monitor=" in str(w.message)]
    assert said == ([f"EarlyStopping(monitor='val_acc', patience={patience}) stops the fit at "
                     "the plateau where DendriteGrowth (patience 2) would grow the model, so "
                     "nothing may grow: give it more patience than the growth callback, or "
                     "leave it out (growth completes and stops the fit itself)"]
                    if warns else [])


def test_resuming_a_completed_run_with_more_epochs_does_not_warn_that_no_validation_ran(
        tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    def settings() -> DendriteGrowth:
        return DendriteGrowth(monitor="val_acc", mode="max", module="net", switch_mode="fixed",
                              fixed_switch_num=1, max_dendrites=1, growth="dendrites")

    first = settings()
    last = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    done = fit(tmp_path, first, max_epochs=10, extra=[last])
    assert first.controller.completed and done.current_epoch < 10
    again = settings()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fit(tmp_path, again, max_epochs=done.current_epoch + 2,
            ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert again.controller.completed and ours(record) == []


def test_the_default_run_folder_does_not_shadow_the_package(tmp_path, monkeypatch):
    # the run files went to <default_root_dir>/perfora: with Lightning's default root (the
    # working directory), the next `import perfora` there found that folder instead of the
    # package (a namespace package without perforate, export, ...)
    import subprocess

    monkeypatch.chdir(tmp_path)
    growth = DendriteGrowth(monitor="val_acc", mode="max", module="net")
    torch.manual_seed(0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[growth])  # default_root_dir: the working directory
    trainer.fit(DigitsNet(), *digits_loaders(200))
    assert (tmp_path / "perfora_runs" / "metrics.csv").exists()
    assert not (tmp_path / "perfora").exists()
    probe = subprocess.run([sys.executable, "-c", "import perfora; perfora.perforate"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
