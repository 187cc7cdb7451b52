"""Bad input met with a clear typed error: settings, scores, rank weights, CLI values."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

import perfora
from perfora import ConfigError, GrowthController, PerforaConfig, ScoreError


def controller(**settings) -> GrowthController:
    model = perfora.perforate(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    return GrowthController(model, write_files=False, **settings)


def test_an_unknown_setting_is_a_config_error_naming_the_setting_meant():
    with pytest.raises(ConfigError, match="n_epochs_to_switch"):
        PerforaConfig(patience=-1)
    with pytest.raises(ConfigError, match="did you mean 'max_dendrites'"):
        PerforaConfig(max_dendrite=2)


@pytest.mark.parametrize("settings, match", [
    ({"improvement_threshold": b"ab"}, "improvement_threshold"),
    ({"improvement_threshold": "0.1"}, "improvement_threshold"),
    ({"dendrite_init_scale": 1e308}, "dendrite_init_scale"),
])
def test_values_that_used_to_slip_through_are_refused(settings, match):
    with pytest.raises(ConfigError, match=match):
        PerforaConfig(**settings)


def test_write_files_that_is_not_a_bool_is_refused_before_the_model_changes():
    model = perfora.perforate(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    with pytest.raises(ConfigError, match="write_files must be True or False, got 'False' "
                                          r"\(a string: write True or False without quotes\)"):
        GrowthController(model, write_files="False", activation="tanh")
    assert {layer.activation for layer in perfora.dendritic_layers(model).values()} == {
        "sigmoid"}  # the controller's setting was not applied


def test_a_large_init_scale_within_the_limit_still_grows_finite():
    ctl = controller(dendrite_init="default", dendrite_init_scale=1e4)
    ctl.add_dendrites()
    assert torch.isfinite(ctl.model(torch.randn(5, 3))).all()


@pytest.mark.parametrize("score, match", [
    (10**400, "too large"),
    (torch.tensor(True), "bool tensor"),
    (True, "bool"),
    ([0.5, 0.6], r"one number, got a list of 2 \(\[0.5, 0.6\]\); reduce it first"),
])
def test_scores_that_are_not_finite_numbers_are_score_errors(score, match):
    with pytest.raises(ScoreError, match=match):
        controller().step(score)


@pytest.mark.parametrize("weight", [0, -1.0, float("nan"), float("inf")])
def test_a_bad_rank_weight_is_a_score_error(weight):
    ctl = controller()
    with pytest.raises(ScoreError, match="weight"):
        ctl.step(0.5, weight=weight)
    assert ctl.epoch == 0  # nothing was recorded


@pytest.mark.timeout(60)
def test_demo_refuses_a_seed_torch_cannot_take_with_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "perfora.cli", "demo", "--seed",
                           "99999999999999999999", "--out", ""], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--seed" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name, match", [
    ("optimizer", r"controller.set_optimizer\(torch.optim.Adam, lr=...\)"),
    ("scheduler", r"controller.set_scheduler"),
    ("rundir", r"GrowthController\(model, run_dir=...\)"),
    ("output_dir", r"GrowthController\(model, run_dir=...\)"),
    ("verbose", r"print\(decision.reason\)"),
])
def test_names_users_reach_for_say_where_that_goes(name, match):
    """Not a list of every setting, or 'did you mean maximize' for optimizer=."""
    with pytest.raises(ConfigError, match=f"unknown setting '{name}': .*{match}"):
        controller(**{name: object()})


def test_keywords_beside_a_config_replace_its_values_and_leave_it_alone():
    """The documented base-config pattern: GrowthController(model, base, max_dendrites=1)."""
    base = PerforaConfig(max_dendrites=4, n_epochs_to_switch=7)
    model = perfora.perforate(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    ctl = GrowthController(model, base, write_files=False, max_dendrites=1)
    assert ctl.config.max_dendrites == 1 and ctl.config.n_epochs_to_switch == 7
    assert base.max_dendrites == 4
