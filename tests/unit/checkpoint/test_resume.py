"""perfora.resume: continue a saved run on a freshly built, unconverted model, exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import perfora


def _build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(96, 6, generator=g)
    return x, (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()


def _epoch(model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> float:
    x, y = _data()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(100 + epoch))
    for idx in order.split(16):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
    with torch.no_grad():
        return nn.functional.cross_entropy(model(x), y).item()


def _train(ctl: perfora.GrowthController, model: nn.Module, until: int) -> None:
    optimizer = ctl.optimizer
    while ctl.epoch < until and not ctl.completed:
        decision = ctl.step(_epoch(model, optimizer, ctl.epoch))
        optimizer = decision.optimizer


CONFIG = {"maximize": False, "switch_mode": "fixed", "fixed_switch_num": 3,
          "max_dendrites": 2, "retain_all_dendrites": True, "checkpoint_time_budget": None}


@pytest.mark.parametrize("stop_at", [3, 5])
def test_resume_on_unconverted_model_equals_uninterrupted(tmp_path: Path, stop_at: int) -> None:
    full_model = perfora.perforate(_build())
    full = perfora.GrowthController(full_model, run_dir=tmp_path / "a", **CONFIG)
    full.set_optimizer(torch.optim.Adam, lr=1e-2)
    full.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5)
    full.build_optimizer()
    _train(full, full_model, 8)

    part_model = perfora.perforate(_build())
    part = perfora.GrowthController(part_model, run_dir=tmp_path / "b", **CONFIG)
    part.set_optimizer(torch.optim.Adam, lr=1e-2)
    part.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5)
    part.build_optimizer()
    _train(part, part_model, stop_at)

    fresh = _build()  # unconverted: resume wraps the same layers and grows the dendrites
    resumed = perfora.resume(fresh, tmp_path / "b" / "latest.safetensors",
                             optimizer=torch.optim.Adam, optimizer_args={"lr": 1e-2},
                             scheduler=torch.optim.lr_scheduler.StepLR,
                             scheduler_args={"step_size": 2, "gamma": 0.5})
    assert resumed.epoch == stop_at
    _train(resumed, fresh, 8)
    assert resumed.num_dendrites == full.num_dendrites == 2
    assert resumed.state.switch_epochs == full.state.switch_epochs
    for (name, a), (_, b) in zip(full_model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name


def test_resume_refuses_a_weights_only_file(tmp_path: Path) -> None:
    model = perfora.perforate(_build())
    perfora.save_model(tmp_path / "m.safetensors", model)
    with pytest.raises(perfora.CheckpointError, match="no controller state"):
        perfora.resume(_build(), tmp_path / "m.safetensors")


def test_resume_into_a_model_of_another_width_says_so(tmp_path: Path) -> None:
    model = perfora.perforate(_build())
    ctl = perfora.GrowthController(model, run_dir=tmp_path, **CONFIG)
    ctl.step(1.0)
    wider = nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))
    with pytest.raises(perfora.CheckpointError, match="9 neurons here but 8"):
        perfora.resume(wider, tmp_path / "latest.safetensors")


def test_resume_takes_the_path_and_the_model_in_either_order(tmp_path: Path) -> None:
    model = perfora.perforate(_build())
    ctl = perfora.GrowthController(model, run_dir=tmp_path, **CONFIG)
    ctl.step(1.0)
    ctl.add_dendrites()
    ctl.save(tmp_path / "c.safetensors")
    for args in ((_build(), tmp_path / "c.safetensors"), (tmp_path / "c.safetensors", _build())):
        resumed = perfora.resume(*args)
        assert (resumed.epoch, resumed.num_dendrites) == (1, 1)
    other = perfora.GrowthController.from_checkpoint(_build(), tmp_path / "c.safetensors")
    assert other.num_dendrites == 1
    with pytest.raises(TypeError, match="takes a model"):
        perfora.resume(tmp_path / "c.safetensors", str(tmp_path / "c.safetensors"))


def test_best_file_of_an_epoch_that_also_grew_resumes_with_an_optimizer(tmp_path: Path) -> None:
    """The epoch that sets the best score can also add dendrites: best.safetensors holds the
    smaller best model, so it must not carry the grown model's optimizer moments."""
    model = perfora.perforate(_build())
    ctl = perfora.GrowthController(model, run_dir=tmp_path, **CONFIG)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-2)
    ctl.build_optimizer()
    _train(ctl, model, 3)  # the loss falls every epoch: epoch 3 is the best and grows
    assert ctl.state.switch_epochs == [3] and ctl.state.best_epoch == 3
    fresh = _build()
    resumed = perfora.resume(fresh, tmp_path / "best.safetensors",
                             optimizer=torch.optim.Adam, optimizer_args={"lr": 1e-2})
    assert resumed.num_dendrites == 0  # the best model is the one before the growth
    optimizer = resumed.optimizer
    assert optimizer is not None and not optimizer.state  # fresh moments, no mismatch
    _train(resumed, fresh, 4)
    assert resumed.epoch == 4
