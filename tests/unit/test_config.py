"""PerforaConfig: one validated settings object; every bad value names the setting and fix."""

from __future__ import annotations

import copy
import json
import pickle
import re

import pytest
from torch import nn

import perfora
from perfora import ConfigError, PerforaConfig
from perfora.config import setting_names

INT_SETTINGS = {"n_epochs_to_switch": 1, "history_lookback": 1, "fixed_switch_num": 1,
                "max_dendrites": 0, "max_dendrite_tries": 1, "candidate_pool": 1,
                "candidate_steps": 0, "signal_rows": 16, "correlation_patience": 1,
                "seed": 0, "latest_every": 1}
BOOL_SETTINGS = ["maximize", "retain_all_dendrites", "capacity_test", "save_checkpoints",
                 "conv_gradmax"]


def test_defaults_are_valid_and_round_trip_through_json():
    config = PerforaConfig()
    data = json.loads(json.dumps(config.to_dict()))
    assert PerforaConfig.from_dict(data) == config
    assert set(data) == set(setting_names())


def test_a_changed_config_round_trips_with_a_threshold_schedule():
    config = PerforaConfig(maximize=False, improvement_threshold=[1e-3, 1e-4], rule="correlation",
                           target_score=1, activation="tanh", extra={"k": [1, 2]})
    again = PerforaConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert again.improvement_threshold == (1e-3, 1e-4)
    assert isinstance(again.target_score, float)


@pytest.mark.parametrize("name,minimum", sorted(INT_SETTINGS.items()))
def test_integer_settings_refuse_values_below_their_minimum(name, minimum):
    with pytest.raises(ConfigError, match=f"{name} must be >= {minimum}"):
        PerforaConfig(**{name: minimum - 1})


@pytest.mark.parametrize("name", sorted(INT_SETTINGS))
def test_integer_settings_refuse_bools_and_fractions_but_take_whole_floats(name):
    with pytest.raises(ConfigError, match=f"{name} must be an integer"):
        PerforaConfig(**{name: True})
    with pytest.raises(ConfigError, match=f"{name} must be an integer"):
        PerforaConfig(**{name: INT_SETTINGS[name] + 0.5})
    value = getattr(PerforaConfig(**{name: float(INT_SETTINGS[name] + 2)}), name)
    assert value == INT_SETTINGS[name] + 2 and type(value) is int


@pytest.mark.parametrize("name", BOOL_SETTINGS)
def test_bool_settings_refuse_truthy_non_bools(name):
    with pytest.raises(ConfigError, match=f"{name} must be True or False"):
        PerforaConfig(**{name: 1})


@pytest.mark.parametrize("settings,message", [
    ({"switch_mode": "patient"}, "did you mean 'patience'"),
    ({"rule": "hebbian"}, "value for rule"),
    ({"activation": "gelu"}, "value for activation"),
    ({"dendrite_init": "xavier"}, "value for dendrite_init"),
    ({"improvement_threshold": []}, "an empty sequence"),
    ({"improvement_threshold": "1e-4"}, "a number or a sequence"),
    ({"improvement_threshold": -1.0}, "improvement_threshold must be >= 0"),
    ({"improvement_threshold_raw": float("nan")}, "must be a finite number"),
    ({"target_score": float("inf")}, "target_score must be a finite number"),
    ({"grow_fraction": 0}, r"grow_fraction must be a fraction in \(0, 1\]"),
    ({"grow_fraction": 1.5}, r"grow_fraction must be a fraction in \(0, 1\]"),
    ({"candidate_lr": 0}, "candidate_lr must be a positive number"),
    ({"dendrite_init_scale": 1e5}, "overflow"),
    ({"correlation_max_epochs_ratio": 0}, "correlation_max_epochs_ratio must be a positive"),
    ({"checkpoint_time_budget": 0}, r"checkpoint_time_budget must be a fraction in \(0, 1\]"),
    ({"checkpoint_time_budget": 2}, r"checkpoint_time_budget must be a fraction in \(0, 1\]"),
    ({"extra": [1]}, "extra must be a dict"),
    ({"rule": "correlation", "grow_fraction": 0.5}, "cannot be combined with rule='correlation'"),
])
def test_bad_values_name_the_setting(settings, message):
    with pytest.raises(ConfigError, match=message):
        PerforaConfig(**settings)


@pytest.mark.parametrize("name,suggestion", [("patience", "n_epochs_to_switch"),
                                             ("max_tries", "max_dendrite_tries"),
                                             ("max_dendrite", "max_dendrites"),
                                             ("retain", "retain_all_dendrites")])
def test_unknown_names_suggest_the_setting_meant(name, suggestion):
    for build in (lambda: PerforaConfig(**{name: 1}),
                  lambda: PerforaConfig.from_dict({name: 1}),
                  lambda: PerforaConfig().replace(**{name: 1})):
        with pytest.raises(ConfigError, match=f"did you mean '{suggestion}'"):
            build()


def test_replace_validates_and_leaves_the_original_alone():
    config = PerforaConfig()
    changed = config.replace(max_dendrites=2)
    assert (config.max_dendrites, changed.max_dendrites) == (5, 2)
    with pytest.raises(ConfigError, match="max_dendrites must be >= 0"):
        config.replace(max_dendrites=-1)


def test_threshold_schedule_is_indexed_by_dendrite_count_and_holds_its_last_value():
    config = PerforaConfig(improvement_threshold=(0.1, 0.01))
    assert [config.threshold_for(k) for k in range(4)] == [0.1, 0.01, 0.01, 0.01]
    assert PerforaConfig(improvement_threshold=0.5).threshold_for(3) == 0.5


def test_error_signal_is_recorded_only_when_growth_uses_it():
    assert PerforaConfig().uses_error_signal()
    assert not PerforaConfig(dendrite_init="default").uses_error_signal()
    assert PerforaConfig(dendrite_init="default", grow_fraction=0.5).uses_error_signal()


def test_no_time_budget_is_allowed():
    assert PerforaConfig(checkpoint_time_budget=None).checkpoint_time_budget is None


def test_a_mapping_of_settings_is_a_config_and_anything_else_is_refused():
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    ctl = perfora.GrowthController(model, {"growth": "dendrites", "max_dendrites": 2},
                                   write_files=False, maximize=False)
    assert (ctl.config.growth, ctl.config.max_dendrites, ctl.config.maximize) == \
        ("dendrites", 2, False)
    with pytest.raises(ConfigError, match="did you mean 'max_dendrites'"):
        perfora.GrowthController(model, {"max_dendrite": 2}, write_files=False)
    with pytest.raises(ConfigError, match="PerforaConfig or a mapping of settings, got list"):
        perfora.GrowthController(model, [("growth", "auto")], write_files=False)


def test_the_growth_callbacks_take_a_mapping_of_settings_too():
    lightning = pytest.importorskip("perfora.integrations.lightning")
    growth = lightning.DendriteGrowth(monitor="val_acc", mode="max",
                                      config={"growth": "dendrites", "max_neuron_steps": 2})
    assert (growth.config.growth, growth.config.max_neuron_steps, growth.config.maximize) == \
        ("dendrites", 2, True)
    with pytest.raises(ConfigError, match="did you mean 'growth'"):
        lightning.DendriteGrowth(config={"grwoth": "dendrites"})
    with pytest.raises(ConfigError, match="got str"):
        lightning.DendriteGrowth(config="growth=dendrites")


@pytest.mark.parametrize(("name", "hint"), [
    ("mode", "for a loss (lower is better) give maximize=False"),
    ("lr", "controller.set_optimizer(torch.optim.Adam, lr=...)"),
    ("learning_rate", "optimizer_args={'lr': ...}"),
    ("monitor", "controller.step(val_score)"),
])
def test_names_from_other_libraries_say_what_to_do_here(name, hint):
    # 'mode' used to suggest switch_mode (unrelated), 'lr' listed 35 setting names
    with pytest.raises(ConfigError, match=re.escape(hint)):
        PerforaConfig(**{name: 1})


@pytest.mark.parametrize("name, value, match", [
    ("max_dendrites", -5, "max_dendrites must be >= 0"),
    ("maximize", "False", "a string: write True or False without quotes"),
    ("growth", "neuron", "growth"),
])
def test_a_setting_assigned_after_construction_is_checked_and_kept_on_failure(name, value,
                                                                              match):
    config = PerforaConfig(max_dendrites=3)
    before = config.to_dict()
    with pytest.raises(ConfigError, match=match):
        setattr(config, name, value)
    assert config.to_dict() == before  # the old value stays


def test_a_misspelt_setting_assigned_is_refused_not_added():
    config = PerforaConfig()
    with pytest.raises(ConfigError, match="did you mean 'max_dendrites'"):
        config.max_dendrite = 1
    assert not hasattr(config, "max_dendrite")


def test_a_valid_assignment_counts_as_given_and_survives_copies():
    config = PerforaConfig()
    config.max_dendrites = 2
    config.improvement_threshold = [0.1, 0.2]  # normalised as at construction
    assert config.max_dendrites == 2 and config.improvement_threshold == (0.1, 0.2)
    assert "max_dendrites" in config.explicit_settings
    for copied in (copy.deepcopy(config), pickle.loads(pickle.dumps(config))):
        assert copied == config
        with pytest.raises(ConfigError):
            copied.max_dendrites = -1


def test_extra_must_be_json():
    with pytest.raises(ConfigError, match="extra must hold JSON values"):
        PerforaConfig(extra={"f": object()})
    assert PerforaConfig(extra={"a": [1, {"b": None}]}).extra == {"a": [1, {"b": None}]}


def test_numpy_scalars_from_a_sweep_grid_are_taken_as_python_values():
    np = pytest.importorskip("numpy")
    config = PerforaConfig(max_dendrites=np.int64(3), grow_fraction=np.float32(0.5),
                           maximize=np.bool_(False))
    assert type(config.max_dendrites) is int and config.max_dendrites == 3
    assert type(config.grow_fraction) is float and config.grow_fraction == 0.5
    assert config.maximize is False
    json.dumps(config.to_dict())  # saved as run files save it
    with pytest.raises(ConfigError, match="max_dendrites must be an integer, got 2.5"):
        PerforaConfig(max_dendrites=np.float64(2.5))
