"""configure_optimizers' LR schedulers go on over each growth step: Lightning rebuilds them
with the optimizers, and they take the old ones' states (a cosine schedule does not start
again from its peak, a ReduceLROnPlateau keeps its reductions)."""

from __future__ import annotations

import math
import sys

import lightning.pytorch as pl
import pytest
import torch

from perfora.integrations.lightning import DendriteGrowth
from perfora.integrations.schedule_carry import capture_schedule, restore_schedule
from tests.support.paths import SCRIPTS

sys.path.insert(0, str(SCRIPTS / "lightning"))
from run_digits import DigitsNet, digits_loaders  # noqa: E402

pytestmark = pytest.mark.xdist_group("test_lightning_schedules")

EPOCHS, STEPS = 4, 14  # 1400 samples in batches of 100
LR = 0.01


class _Scheduled(DigitsNet):
    """DigitsNet with a per-step cosine schedule or a ReduceLROnPlateau; records the rate
    of every training step."""

    def __init__(self, kind: str) -> None:
        super().__init__(lr=LR)
        self.kind, self.rates = kind, []

        # optimizers trained with, counted as they change: the last one is held, so a new
        # one cannot take its id (comparing ids of freed optimizers miscounted a rebuild)
        self.optimizers_seen, self._last_optimizer = 0, None

    def training_step(self, batch, batch_idx):
        optimizer = self.trainer.optimizers[0]
        self.rates.append(optimizer.param_groups[0]["lr"])
        if optimizer is not self._last_optimizer:
            self.optimizers_seen, self._last_optimizer = self.optimizers_seen + 1, optimizer
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        opt = torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=self.lr)
        if self.kind == "cosine":
            cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS * STEPS)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": cosine, "interval": "step"}}
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", patience=0,
                                                             factor=0.5, threshold=1.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_acc"}}


def _fit(tmp_path, kind: str, growth: str) -> tuple[_Scheduled, DendriteGrowth]:
    torch.manual_seed(0)
    model = _Scheduled(kind)
    callback = DendriteGrowth(monitor="val_acc", mode="max", module="net", growth=growth,
                              switch_mode="fixed", fixed_switch_num=1, max_dendrites=3,
                              max_neuron_steps=3, verbose=False)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, logger=False,
                         callbacks=[callback], enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path))
    trainer.fit(model, *digits_loaders(100))
    return model, callback


@pytest.mark.timeout(180)
@pytest.mark.parametrize("growth", ["dendrites", "neurons"])
def test_a_per_step_cosine_schedule_goes_on_over_each_growth_step(tmp_path, growth):
    # it restarted from lr=0.01 at every growth step (configure_optimizers ran again)
    model, callback = _fit(tmp_path, "cosine", growth)
    assert model.optimizers_seen >= 3  # rebuilt at two growth steps at least
    expected = [LR * (1 + math.cos(math.pi * t / (EPOCHS * STEPS))) / 2
                for t in range(EPOCHS * STEPS)]
    assert model.rates == pytest.approx(expected, rel=1e-6, abs=1e-12)


@pytest.mark.timeout(180)
def test_a_reduce_on_plateau_keeps_its_reductions_over_each_growth_step(tmp_path):
    model, callback = _fit(tmp_path, "plateau", "dendrites")
    assert model.optimizers_seen >= 3  # rebuilt at two growth steps at least
    per_epoch = model.rates[::STEPS]
    # threshold=1.0: no epoch after the first counts as better, so every validation after
    # the first halves the rate
    assert per_epoch == pytest.approx([LR * 0.5 ** max(e - 1, 0) for e in range(EPOCHS)])


def test_a_rebuild_that_builds_other_schedulers_starts_afresh_with_a_warning():
    weight = torch.nn.Parameter(torch.ones(2))
    old = torch.optim.SGD([weight], lr=1.0)
    step = torch.optim.lr_scheduler.StepLR(old, step_size=1, gamma=0.5)
    old.step()
    step.step()
    saved = capture_schedule([old], [step])
    new = torch.optim.SGD([weight], lr=1.0)
    other = torch.optim.lr_scheduler.ExponentialLR(new, gamma=0.9)
    with pytest.warns(UserWarning, match=r"starts again.*ExponentialLR.*rather than.*StepLR"):
        restore_schedule(saved, [new], [other])
    assert new.param_groups[0]["lr"] == 1.0
    same = torch.optim.lr_scheduler.StepLR(new, step_size=1, gamma=0.5)
    restore_schedule(saved, [new], [same])
    assert new.param_groups[0]["lr"] == 0.5 and same.last_epoch == 1
