"""A run resumes with its scheduler: ReduceLROnPlateau (it keeps an infinity in its state)
and MultiStepLR (its milestones have int keys, which JSON writes as text) were refused as
"not the scheduler registered now", and text keys would silently stop the decay."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

import perfora

X = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
Y = torch.arange(64) % 2
SCORES = [0.50, 0.51, 0.52, 0.52, 0.52, 0.52, 0.52, 0.53, 0.53, 0.53]


def _build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 2))


def _train(ctl: perfora.GrowthController, until: int) -> list[float]:
    rates = []
    model, opt = ctl.model, ctl.optimizer
    while ctl.epoch < until:
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), Y).backward()
        opt.step()
        decision = ctl.step(SCORES[ctl.epoch])
        model, opt = decision.model, decision.optimizer
        rates.append(opt.param_groups[0]["lr"])
    return rates


@pytest.mark.parametrize(("scheduler", "args"), [
    (lr_scheduler.ReduceLROnPlateau, {"mode": "max", "patience": 1, "factor": 0.5}),
    (lr_scheduler.MultiStepLR, {"milestones": [4, 6], "gamma": 0.1}),
])
def test_a_resumed_run_follows_the_same_learning_rates(tmp_path, scheduler, args):
    def start(run_dir):
        ctl = perfora.GrowthController(perfora.perforate(_build()), run_dir=run_dir,
                                       maximize=True, n_epochs_to_switch=50,
                                       checkpoint_time_budget=None)
        ctl.set_optimizer(torch.optim.SGD, lr=0.1)
        ctl.set_scheduler(scheduler, **args)
        ctl.build_optimizer()
        return ctl

    whole = _train(start(tmp_path / "whole"), len(SCORES))
    first = _train(start(tmp_path / "cut"), 3)
    resumed = perfora.resume(_build(), tmp_path / "cut" / "latest.safetensors",
                             optimizer=torch.optim.SGD, optimizer_args={"lr": 0.1},
                             scheduler=scheduler, scheduler_args=args)
    assert resumed.epoch == 3
    rest = _train(resumed, len(SCORES))
    assert first + rest == whole
    assert whole[-1] < whole[0]  # the rate did decay



def _stepped_run(run_dir) -> None:
    """Three epochs of a run with a StepLR registered, saved as ``latest`` in ``run_dir``."""
    ctl = perfora.GrowthController(perfora.perforate(_build()), run_dir=run_dir,
                                   maximize=True, n_epochs_to_switch=50,
                                   checkpoint_time_budget=None)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    ctl.set_scheduler(lr_scheduler.StepLR, step_size=2, gamma=0.5)
    ctl.build_optimizer()
    _train(ctl, 3)


def _fresh(run_dir) -> perfora.GrowthController:
    return perfora.GrowthController(perfora.perforate(_build()), run_dir=run_dir,
                                    maximize=True, n_epochs_to_switch=50)


@pytest.mark.parametrize("how", ["resume", "load"])
def test_a_resume_without_the_runs_scheduler_warns_that_the_rate_stays(tmp_path, how):
    # the rate silently stayed where it was for the rest of the run
    _stepped_run(tmp_path)
    expected = (r"latest.safetensors holds the state of the LR scheduler its run stepped "
                r"\(last_epoch 3\), and none is registered here.*set_scheduler")
    with pytest.warns(UserWarning, match=expected):
        if how == "resume":
            perfora.resume(_build(), tmp_path / "latest.safetensors",
                           optimizer=torch.optim.SGD, optimizer_args={"lr": 0.1})
        else:
            again = _fresh(tmp_path)
            again.set_optimizer(torch.optim.SGD, lr=0.1)
            again.load("latest")


def test_a_resume_with_the_runs_scheduler_does_not_warn(tmp_path):
    import warnings

    _stepped_run(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed = perfora.resume(_build(), tmp_path / "latest.safetensors",
                                 optimizer=torch.optim.SGD, optimizer_args={"lr": 0.1},
                                 scheduler=lr_scheduler.StepLR,
                                 scheduler_args={"step_size": 2, "gamma": 0.5})
    assert resumed.scheduler.last_epoch == 3


def test_an_optimizer_registered_after_the_load_without_the_scheduler_warns(tmp_path):
    _stepped_run(tmp_path)
    again = _fresh(tmp_path)
    again.load("latest")  # the optimizer's state waits for the first build: no warning yet
    again.set_optimizer(torch.optim.SGD, lr=0.1)
    with pytest.warns(UserWarning, match="the loaded checkpoint holds the state of the LR "
                                         "scheduler"):
        again.build_optimizer()


def test_a_loop_that_also_steps_the_registered_scheduler_is_warned_once(tmp_path):
    # the schedule silently ran twice as fast (perfora steps it in step() as well)
    ctl = _fresh(None)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    ctl.set_scheduler(lr_scheduler.StepLR, step_size=1, gamma=0.5)
    _, scheduler = ctl.build_optimizer()
    with pytest.warns(UserWarning, match=r"StepLR\) was stepped 1 time\(s\) since perfora "
                                         r"stepped it.*remove it") as record:
        for score in SCORES[:3]:
            scheduler.step()
            ctl.step(score)
    assert sum("was stepped" in str(w.message) for w in record) == 1


def test_a_resumed_run_stepped_by_perfora_alone_is_not_warned_about(tmp_path):
    import warnings

    _stepped_run(tmp_path)
    resumed = perfora.resume(_build(), tmp_path / "latest.safetensors",
                             optimizer=torch.optim.SGD, optimizer_args={"lr": 0.1},
                             scheduler=lr_scheduler.StepLR,
                             scheduler_args={"step_size": 2, "gamma": 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train(resumed, 6)
    assert resumed.scheduler.last_epoch == 6
