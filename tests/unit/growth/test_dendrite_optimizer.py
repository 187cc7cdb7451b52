"""``dendrite_optimizer``: after a dendrite set the optimizer restarts (the default,
PerforatedAI's way, which the compatibility shell keeps) or carries on ('carry': every old
parameter keeps its moments, the schedule its step, as after a neuron step)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import perfora
from perfora.compat.settings import PAISettings

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


def _run(**settings) -> tuple[dict, float, perfora.Decision, list[str]]:
    """Three epochs of Adam with a StepLR, a dendrite set at the third score; returns the
    moments by name before the set, the rate then, the decision and any warnings after."""
    model, ctl = _controller(fixed_switch_num=3, max_dendrites=2, **settings)
    ctl.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    opt, _ = ctl.build_optimizer()

    def epoch() -> None:
        for i in range(4):
            opt.zero_grad()
            rows = slice(16 * i, 16 * i + 16)
            nn.functional.cross_entropy(model(X[rows]), Y[rows]).backward()
            opt.step()

    for _ in range(2):
        epoch()
        assert not ctl.step(0.5).restructured
    epoch()
    before = {name: {k: v.clone() for k, v in opt.state[p].items()}
              for name, p in model.named_parameters()}
    lr = opt.param_groups[0]["lr"]
    decision = ctl.step(0.5)
    assert decision.restructured and ctl.num_dendrites == 1, decision.reason
    model, opt = decision.model, decision.optimizer
    with warnings.catch_warnings(record=True) as caught:  # the schedule stepped by perfora
        warnings.simplefilter("always")
        for _ in range(2):
            epoch()
            ctl.step(0.4)
    return before, lr, decision, [str(w.message) for w in caught]


def test_with_carry_the_optimizer_goes_on_after_a_dendrite_set():
    before, lr, decision, caught = _run(dendrite_optimizer="carry")
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
    before, _, decision, _ = _run_until_the_set(dendrite_optimizer="carry")
    opt, names = decision.optimizer, dict(decision.model.named_parameters())
    for name, saved in before.items():
        state = opt.state[names[name]]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[key], saved[key]), (name, key)
    assert all(not opt.state[p] for n, p in names.items() if n not in before)


def _run_until_the_set(**settings) -> tuple[dict, float, perfora.Decision, None]:
    model, ctl = _controller(fixed_switch_num=1, max_dendrites=1, **settings)
    opt, _ = ctl.build_optimizer()
    opt.zero_grad()
    nn.functional.cross_entropy(model(X), Y).backward()
    opt.step()
    before = {name: {k: v.clone() for k, v in opt.state[p].items()}
              for name, p in model.named_parameters()}
    decision = ctl.step(0.5)
    assert decision.restructured, decision.reason
    return before, 0.01, decision, None


def test_by_default_a_fresh_optimizer_and_schedule_follow_a_dendrite_set():
    _, _, decision, caught = _run()
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
