"""Lightning checkpoints taken at another structure than the model's: ``trainer.test``,
``validate`` and ``predict`` with ``ckpt_path=`` load a checkpoint from before a growth step
into the grown model (and any checkpoint into a fresh one), and leave the fit's growth run
as it was."""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from perfora.errors import ConfigError
from perfora.integrations.lightning import DendriteGrowth, load_grown_checkpoint
from tests.support.paths import ROOT, SCRIPTS

sys.path.insert(0, str(SCRIPTS / "lightning"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from rss import peak_rss_bytes, reset_peak_rss, rss_bytes  # noqa: E402
from run_digits import DigitsNet, digits_loaders  # noqa: E402

pytestmark = pytest.mark.xdist_group("test_lightning_checkpoints")


class _Evaluated(DigitsNet):
    """DigitsNet with a test and a predict step."""

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(-1) == y).float().mean())

    def predict_step(self, batch, batch_idx):
        return self(batch[0])


def _fit(tmp_path: Path, growth: str) -> tuple[_Evaluated, DendriteGrowth, pl.Trainer]:
    torch.manual_seed(0)
    model = _Evaluated()
    callback = DendriteGrowth(monitor="val_acc", mode="max", module="net", growth=growth,
                              switch_mode="fixed", fixed_switch_num=2, max_dendrites=3,
                              max_neuron_steps=3)
    every_epoch = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{epoch}", save_top_k=-1)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False,
                         callbacks=[callback, every_epoch], enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    train, val = digits_loaders(100)
    trainer.fit(model, train, val)
    return model, callback, trainer


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("growth", ["dendrites", "neurons"])
def test_test_validate_and_predict_load_a_checkpoint_from_before_the_growth_step(
        tmp_path, growth):
    # they failed with "size mismatch for net.0.base.weight", and the test rewound the
    # fit's growth run (controller epoch, metrics.csv) to the checkpoint's epoch
    model, callback, trainer = _fit(tmp_path, growth)
    ctl = callback.controller
    grown = {k: v.shape for k, v in model.state_dict().items()}
    before_growth = tmp_path / "ckpt" / "epoch=0.ckpt"
    saved = torch.load(before_growth, weights_only=True)["state_dict"]
    assert {k: v.shape for k, v in saved.items()} != grown  # it really is another structure
    run = (ctl.epoch, ctl.num_dendrites, ctl.completed, _rows(tmp_path / "perfora_runs" /
                                                                "metrics.csv"))
    _, val = digits_loaders(100)

    result = trainer.test(model, val, ckpt_path=str(before_growth), verbose=False)
    state = model.state_dict()
    assert state.keys() == saved.keys()
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    assert (ctl.epoch, ctl.num_dendrites, ctl.completed,
            _rows(tmp_path / "perfora_runs" / "metrics.csv")) == run

    fresh = _Evaluated()  # not perforated: it takes the checkpoint's structure too
    fresh_trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False,
                               callbacks=[DendriteGrowth(monitor="val_acc", mode="max",
                                                         module="net")],
                               enable_progress_bar=False, enable_model_summary=False,
                               default_root_dir=str(tmp_path / "fresh"))
    assert fresh_trainer.test(fresh, val, ckpt_path=str(before_growth),
                              verbose=False) == result
    last = tmp_path / "ckpt" / "epoch=2.ckpt"
    predicted = torch.cat(fresh_trainer.predict(fresh, val, ckpt_path=str(last)))
    assert {k: v.shape for k, v in fresh.state_dict().items()} == grown
    trainer.validate(model, val, ckpt_path=str(last), verbose=False)  # back to the end
    with torch.no_grad():
        assert torch.equal(torch.cat([model(x) for x, _ in val]), predicted)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("growth", ["dendrites", "neurons"])
def test_load_grown_checkpoint_builds_the_module_a_grown_fit_saved(tmp_path, growth):
    # LightningModule.load_from_checkpoint fails on such a checkpoint: missing keys (the
    # dendrites) and size mismatches (the neurons)
    model, _, _ = _fit(tmp_path, growth)
    last = tmp_path / "ckpt" / "epoch=2.ckpt"
    with pytest.raises(RuntimeError, match="Missing key|size mismatch"):
        _Evaluated.load_from_checkpoint(last)
    loaded = load_grown_checkpoint(_Evaluated, last, lr=0.5)
    assert loaded.lr == 0.5  # the keywords override hyperparameters, as in Lightning
    state, saved = loaded.state_dict(), torch.load(last, weights_only=True)["state_dict"]
    assert state.keys() == saved.keys()
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    x = torch.rand(4, 64)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x), model.eval()(x))


@pytest.mark.timeout(180)
def test_load_grown_checkpoint_reads_only_the_weights_of_a_large_checkpoint(tmp_path):
    # it read the whole checkpoint, then copied all but the weights for Lightning's loader:
    # a checkpoint with 256 MB of optimizer state took over 500 MB to load a small model
    model, _, _ = _fit(tmp_path, "dendrites")
    checkpoint = torch.load(tmp_path / "ckpt" / "epoch=2.ckpt", weights_only=True)
    checkpoint["optimizer_states"] = [{"state": {0: {"exp_avg": torch.ones(2**26)}}}]
    padded, legacy = tmp_path / "padded.ckpt", tmp_path / "legacy.ckpt"
    torch.save(checkpoint, padded)
    torch.save({**checkpoint, "optimizer_states": []}, legacy,
               _use_new_zipfile_serialization=False)  # torch's old format: read whole
    del checkpoint
    x = torch.rand(4, 64)
    with torch.no_grad():
        expected = model.eval()(x)
    start = rss_bytes()
    reset_peak_rss()
    loaded = load_grown_checkpoint(_Evaluated, padded)
    assert peak_rss_bytes() - start < 64 * 2**20  # far below the 256 MB it never reads
    from_legacy = load_grown_checkpoint(_Evaluated, legacy)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x), expected)
        assert torch.equal(from_legacy.eval()(x), expected)


def test_load_grown_checkpoint_loads_a_checkpoint_without_growth_as_lightning_does(tmp_path):
    torch.manual_seed(0)
    model = _Evaluated()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=str(tmp_path))
    train, _ = digits_loaders(100)
    trainer.fit(model, train)
    trainer.save_checkpoint(tmp_path / "plain.ckpt")
    loaded = load_grown_checkpoint(_Evaluated, tmp_path / "plain.ckpt")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 model.state_dict().values()))


@pytest.mark.timeout(180)
def test_a_checkpoint_that_grew_another_module_is_refused_naming_both(tmp_path):
    _fit(tmp_path, "dendrites")
    _, val = digits_loaders(100)
    other = DendriteGrowth(monitor="val_acc", mode="max", module="net.0")
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[other],
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path / "other"))
    with pytest.raises(ConfigError, match=r"the checkpoint grew module 'net', this "
                                          r"DendriteGrowth\(module='net.0'\)"):
        trainer.test(_Evaluated(), val, ckpt_path=str(tmp_path / "ckpt" / "epoch=2.ckpt"),
                     verbose=False)
