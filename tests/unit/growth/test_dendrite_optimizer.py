"""``dendrite_optimizer``: after a dendrite set the optimizer restarts ('restart',
PerforatedAI's way, which the compatibility shell keeps), carries on ('carry': every old
parameter keeps its moments, the schedule its step, as after a neuron step), or ('auto')
restarts while the network is still near its start and carries on once it fits."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import perfora
from perfora.compat.settings import PAISettings
from perfora.growth.policy import carries_optimizer
from perfora.growth.state import ControllerState

X = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] * X[:, 1] > 0).long()


def _controller(**settings) -> tuple[nn.Module, perfora.GrowthController]:
    """A small perforated MLP and a controller that grows dendrite sets on a fixed schedule,
    with Adam registered."""
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2)))
    ctl = perfora.GrowthController(model, **{"growth": "dendrites", "switch_mode": "fixed",
                                             "write_files": False, "dendrite_init": "default",
                                             **settings})
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    return model, ctl


def _run(scores: tuple[float, ...] = (0.5, 0.5, 0.5), **settings
         ) -> tuple[dict, float, perfora.Decision, list[str]]:
    """Three epochs of Adam with a StepLR, a dendrite set at the third score (``scores``:
    the three reported); returns the moments by name before the set, the rate then, the
    decision and any warnings after."""
    model, ctl = _controller(fixed_switch_num=3, max_dendrites=2, **settings)
    ctl.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    opt, _ = ctl.build_optimizer()

    def epoch() -> None:
        for i in range(4):
            opt.zero_grad()
            rows = slice(16 * i, 16 * i + 16)
            nn.functional.cross_entropy(model(X[rows]), Y[rows]).backward()
            opt.step()

    for score in scores[:2]:
        epoch()
        assert not ctl.step(score).restructured
    epoch()
    before = {name: {k: v.clone() for k, v in opt.state[p].items()}
              for name, p in model.named_parameters()}
    lr = opt.param_groups[0]["lr"]
    decision = ctl.step(scores[2])
    assert decision.restructured and ctl.num_dendrites == 1, decision.reason
    model, opt = decision.model, decision.optimizer
    with warnings.catch_warnings(record=True) as caught:  # the schedule stepped by perfora
        warnings.simplefilter("always")
        for _ in range(2):
            epoch()
            ctl.step(0.4)
    return before, lr, decision, [str(w.message) for w in caught]


@pytest.mark.parametrize("settings", [
    {"dendrite_optimizer": "carry"},
    # 'auto' once the network fits: the best accuracy (0.6) is 3 times the first (0.2)
    {"dendrite_optimizer": "auto", "scores": (0.2, 0.5, 0.6)},
    # ... or the best loss (0.3) is under half the first (1.0)
    {"dendrite_optimizer": "auto", "scores": (1.0, 0.4, 0.3), "maximize": False},
], ids=["carry", "auto-accuracy", "auto-loss"])
def test_with_carry_the_optimizer_goes_on_after_a_dendrite_set(settings):
    before, lr, decision, caught = _run(**settings)
    opt, names = decision.optimizer, dict(decision.model.named_parameters())
    assert lr == 0.01 * 0.5 ** 2
    assert opt.param_groups[0]["lr"] == 0.01 * 0.5 ** 4  # the schedule went on (2 more epochs)
    assert decision.scheduler.last_epoch == 4
    assert not any("was stepped" in m for m in caught), caught  # no false double-step warning
    for name, saved in before.items():  # the old parameters' moments went on (then 2 epochs)
        assert opt.state[names[name]]["step"] == saved["step"] + 8, name
    new = [n for n in names if n not in before]
    assert new and all(opt.state[names[n]]["step"] == 8 for n in new)  # fresh 2 epochs ago


def test_the_carried_moments_are_the_old_optimizers():
    # right at the set: the rebuilt optimizer holds the old moments, the new dendrites none
    before, decision = _run_until_the_set(dendrite_optimizer="carry")
    opt, names = decision.optimizer, dict(decision.model.named_parameters())
    for name, saved in before.items():
        state = opt.state[names[name]]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[key], saved[key]), (name, key)
    assert all(not opt.state[p] for n, p in names.items() if n not in before)


def _run_until_the_set(**settings) -> tuple[dict, perfora.Decision]:
    """One training step, then the set: the old optimizer's state per parameter name, and
    the decision that added the set."""
    model, ctl = _controller(fixed_switch_num=1, max_dendrites=1, **settings)
    opt, _ = ctl.build_optimizer()
    opt.zero_grad()
    nn.functional.cross_entropy(model(X), Y).backward()
    opt.step()
    before = {name: {k: v.clone() for k, v in opt.state[p].items()}
              for name, p in model.named_parameters()}
    decision = ctl.step(0.5)
    assert decision.restructured, decision.reason
    return before, decision


@pytest.mark.parametrize("settings", [
    {"dendrite_optimizer": "restart"},
    # 'auto' near the start: the best accuracy (0.55) is within half of the first (0.5)
    {"dendrite_optimizer": "auto", "scores": (0.5, 0.52, 0.55)},
    {"dendrite_optimizer": "auto", "scores": (0.69, 0.68, 0.7), "maximize": False},
], ids=["restart", "auto-accuracy", "auto-loss"])
def test_a_restart_gives_a_fresh_optimizer_and_schedule_after_a_dendrite_set(settings):
    _, _, decision, caught = _run(**settings)
    opt = decision.optimizer
    # two epochs into a new schedule, every parameter's moments from those two epochs only
    assert opt.param_groups[0]["lr"] == 0.01 * 0.5 ** 2
    assert decision.scheduler.last_epoch == 2
    assert all(state["step"] == 8 for state in opt.state.values())
    assert not any("was stepped" in m for m in caught), caught


def test_the_compatibility_shell_restarts_as_perforatedai_does():
    assert PAISettings().to_config().dendrite_optimizer == "restart"
    assert perfora.PerforaConfig().dendrite_optimizer == "restart"
    with pytest.raises(perfora.ConfigError,
                       match="dendrite_optimizer: 'fresh'; did you mean 'restart'"):
        perfora.PerforaConfig(dendrite_optimizer="fresh")


def test_carry_under_the_correlation_rule_gives_state_only_to_what_trains(tmp_path):
    # after a set the correlation rule trains the new dendrites alone: the frozen base's
    # carried moments went into an optimizer that does not hold it, and the next
    # checkpoint failed in optimizer.state_dict() with a KeyError
    model, ctl = _controller(rule="correlation", fixed_switch_num=1, max_dendrites=1,
                             write_files=True, run_dir=tmp_path, dendrite_optimizer="carry",
                             checkpoint_time_budget=None)
    opt, _ = ctl.build_optimizer()
    for _ in range(2):
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), Y).backward()
        opt.step()
        decision = ctl.step(0.5)
        model, opt = decision.model, decision.optimizer
    assert ctl.num_dendrites == 1
    held = {p for group in opt.param_groups for p in group["params"]}
    assert set(opt.state) <= held
    assert (tmp_path / "latest.safetensors").is_file()  # written after the set


@pytest.mark.parametrize(("first", "best", "carries"), [
    (0.5, 0.74, False), (0.5, 0.75, True),  # accuracy: the best half as much again
    (2.3, 1.2, False), (2.3, 1.15, True),  # loss: the best half the first
    (0.0, 0.0, False), (0.0, 0.3, True), (-1.0, -0.4, True),  # any sign, zero
    (None, None, False),  # a run saved before first_score: restart, as before
])
def test_auto_carries_on_once_the_best_score_is_half_the_first_away(first, best, carries):
    config = perfora.PerforaConfig(dendrite_optimizer="auto")
    state = ControllerState(first_score=first, global_best=best)
    assert carries_optimizer(config, state, "dendrites") is carries
    assert carries_optimizer(config, state, "neurons")  # a neuron step always carries on
    assert not carries_optimizer(config, state, None)


def test_the_first_score_is_kept_through_a_checkpoint():
    _, ctl = _controller(fixed_switch_num=5, dendrite_optimizer="auto")
    for score in (0.3, 0.6, 0.7):
        ctl.step(score)
    saved = ctl.state.to_dict(history_rows=0)
    assert saved["first_score"] == 0.3
    assert ControllerState.from_saved(saved).first_score == 0.3
    with pytest.raises(perfora.CheckpointError, match="first_score"):
        ControllerState.from_saved({**saved, "first_score": "0.3"})


RESUME_SCORES = (0.5, 0.55, 0.6, 0.8, 0.85, 0.9)
"""A set every 2 epochs: at epoch 2 near the start (restart), at 4 and 6 fitting (carry)."""


def _auto_run(tmp_path, stop_after: int | None = None, resume: bool = False
              ) -> perfora.GrowthController:
    if resume:
        ctl = perfora.resume(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2)),
                             tmp_path / "latest.safetensors", optimizer=torch.optim.Adam,
                             optimizer_args={"lr": 0.01})
    else:
        _, ctl = _controller(fixed_switch_num=2, max_dendrites=3, write_files=True,
                             run_dir=tmp_path, checkpoint_time_budget=None,
                             dendrite_optimizer="auto")
        ctl.build_optimizer()
    model, opt = ctl.model, ctl.optimizer
    while ctl.epoch < len(RESUME_SCORES) and ctl.epoch != stop_after:
        for i in range(4):
            opt.zero_grad()
            rows = slice(16 * i, 16 * i + 16)
            nn.functional.cross_entropy(model(X[rows]), Y[rows]).backward()
            opt.step()
        decision = ctl.step(RESUME_SCORES[ctl.epoch])
        model, opt = decision.model, decision.optimizer
    return ctl


def test_a_resumed_auto_run_restarts_and_carries_on_as_the_uninterrupted_one(tmp_path):
    whole = _auto_run(tmp_path / "whole")
    assert whole.num_dendrites == 3
    # the sets at epochs 4 and 6 carried on: Adam's steps since the restart at epoch 2 for
    # the base and set 1 (4 epochs of 4 batches), since epoch 4 for set 2, none for set 3
    # (a restart at 6 would have left no state at all)
    steps = sorted({int(s["step"]) for s in whole.optimizer.state.values()})
    assert steps == [8, 16], steps
    _auto_run(tmp_path / "cut", stop_after=3)  # after the restart, before the carried sets
    resumed = _auto_run(tmp_path / "cut", resume=True)
    assert resumed.state.first_score == whole.state.first_score == 0.5
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    sa, sb = whole.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for key in sa:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[key][name], sb[key][name]), (key, name)
