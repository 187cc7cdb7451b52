"""GrowthController.from_checkpoint: what perfora.resume does, reading the file once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import perfora
from perfora.checkpoint import format as ckpt_module


def _run(tmp_path: Path) -> perfora.GrowthController:
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    ctl = perfora.GrowthController(model, seed=0, n_epochs_to_switch=2, max_dendrites=2,
                                   run_dir=tmp_path, checkpoint_time_budget=None)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-2)
    ctl.build_optimizer()
    for score in [0.5, 0.5, 0.5, 0.6]:
        ctl.step(score)
    assert ctl.num_dendrites >= 1
    return ctl


def _fresh() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_from_checkpoint_reads_once_and_matches_resume(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ctl = _run(tmp_path)
    path = ctl.checkpoint_path("latest")
    reads: list[Path] = []
    real = ckpt_module.load_checkpoint

    def counting(p, *args):
        reads.append(Path(p))
        return real(p, *args)

    monkeypatch.setattr(ckpt_module, "load_checkpoint", counting)
    a = perfora.GrowthController.from_checkpoint(path, _fresh(), optimizer=torch.optim.Adam,
                                                 optimizer_args={"lr": 1e-2})
    assert reads == [path]
    b = perfora.resume(_fresh(), path, optimizer=torch.optim.Adam, optimizer_args={"lr": 1e-2})
    assert len(reads) == 2  # resume delegates: one more read, not two
    for c in (a, b):
        assert c.state.to_dict() == ctl.state.to_dict()
        assert c.num_dendrites == ctl.num_dendrites and c.run_dir == tmp_path
        assert isinstance(c.optimizer, torch.optim.Adam)
    for (name, x), (_, y) in zip(perfora.unwrap_model(a.model).state_dict().items(),
                                 perfora.unwrap_model(ctl.model).state_dict().items()):
        assert torch.equal(x, y), name


def test_from_checkpoint_takes_a_config_and_overrides(tmp_path: Path) -> None:
    ctl = _run(tmp_path)
    path = ctl.checkpoint_path("latest")
    config = ctl.config.replace(max_dendrites=5)
    a = perfora.GrowthController.from_checkpoint(path, _fresh(), config,
                                                 run_dir=tmp_path / "other")
    assert a.config.max_dendrites == 5 and a.run_dir == tmp_path / "other"
    b = perfora.GrowthController.from_checkpoint(path, _fresh(), config, max_dendrites=3)
    assert b.config.max_dendrites == 3
    c = perfora.GrowthController.from_checkpoint(path, _fresh(), max_dendrites=4)
    assert c.config.max_dendrites == 4 and c.config.seed == ctl.config.seed
