"""A growth callback's ``patience``, ``max_dendrites`` and ``mode`` against ``config=``: a
setting made in the config is used, never silently replaced by the callback's own default
(it used to be: ``config=PerforaConfig(n_epochs_to_switch=4, maximize=True)`` ran with
patience 10 and minimized); the two ways disagreeing is an error."""

from __future__ import annotations

import pytest

from perfora import ConfigError, PerforaConfig
from perfora.integrations.lightning import DendriteGrowth

CONFIGS = [PerforaConfig(n_epochs_to_switch=4, max_dendrites=6, maximize=False),
           {"n_epochs_to_switch": 4, "max_dendrites": 6, "maximize": False}]


@pytest.mark.parametrize("config", CONFIGS, ids=["PerforaConfig", "mapping"])
def test_lightning_callback_takes_what_config_sets(config):
    callback = DendriteGrowth(monitor="val_acc", config=config)
    assert callback.config.n_epochs_to_switch == 4 and callback.config.max_dendrites == 6
    assert callback.mode == "min" and callback.config.maximize is False


DEFAULT_VALUED = [PerforaConfig(maximize=True, max_dendrites=5),
                  {"maximize": True, "max_dendrites": 5}]


@pytest.mark.parametrize("config", DEFAULT_VALUED, ids=["PerforaConfig", "mapping"])
def test_a_setting_given_at_its_config_default_still_counts_as_given(config):
    # PerforaConfig's defaults (maximize=True, max_dendrites=5) are not the callback's
    # ("min", 3): a value given in the config wins even where it equals the config default
    callback = DendriteGrowth(monitor="val_score", config=config)
    assert callback.mode == "max" and callback.config.maximize is True
    assert callback.config.max_dendrites == 5
    changed = PerforaConfig(maximize=True).replace(seed=2)
    assert DendriteGrowth(config=changed).mode == "max"


def test_module_takes_the_attribute_path_not_the_module():
    import torch

    with pytest.raises(ConfigError, match=r'module="net" for self.net\), not the Linear'):
        DendriteGrowth(module=torch.nn.Linear(2, 2))


def test_lightning_callback_defaults_where_neither_sets_them():
    callback = DendriteGrowth(config=PerforaConfig(seed=3))
    assert callback.config.n_epochs_to_switch == 10 and callback.config.max_dendrites == 3
    assert callback.mode == "min" and callback.config.maximize is False
    assert callback.config.seed == 3
    keywords = DendriteGrowth(mode="max", patience=2, max_dendrites=1)
    assert keywords.config.n_epochs_to_switch == 2 and keywords.config.max_dendrites == 1
    assert keywords.config.maximize is True


def test_the_same_setting_given_both_ways_must_agree():
    same = DendriteGrowth(patience=4, config={"n_epochs_to_switch": 4})
    assert same.config.n_epochs_to_switch == 4
    with pytest.raises(ConfigError, match=r"DendriteGrowth\(patience=3\) and config="
                                          r"\{'n_epochs_to_switch': 4\} disagree"):
        DendriteGrowth(patience=3, config=PerforaConfig(n_epochs_to_switch=4))
    with pytest.raises(ConfigError, match=r"\(max_dendrites=2\) and config="):
        DendriteGrowth(max_dendrites=2, config={"max_dendrites": 6})
    with pytest.raises(ConfigError, match=r"\(mode='min'\) and config=\{'maximize': True\}"):
        DendriteGrowth(mode="min", config={"maximize": True})


def test_hugging_face_callback_takes_what_config_sets():
    pytest.importorskip("transformers")
    from perfora.integrations.transformers import DendriteGrowthCallback

    callback = DendriteGrowthCallback(config=PerforaConfig(n_epochs_to_switch=4,
                                                           maximize=False))
    assert callback.mode == "min"  # from the config, not the Trainer's conventions
    config = callback.growth_config(callback.mode)
    assert config.n_epochs_to_switch == 4 and config.max_dendrites == 3
    assert DendriteGrowthCallback().mode is None  # left to the Trainer's conventions at bind
    with pytest.raises(ConfigError, match="disagree"):
        DendriteGrowthCallback(patience=2, config={"n_epochs_to_switch": 4})


@pytest.mark.parametrize("flag", ["log_metrics", "verbose"])
@pytest.mark.parametrize("value", ["False", 0, None])
def test_lightning_callback_flags_refuse_non_bools(flag, value):
    """``bool("False")`` is True: a flag taken through ``bool()`` turned on when asked off."""
    with pytest.raises(ConfigError, match=f"{flag} must be True or False, got {value!r}"):
        DendriteGrowth(**{flag: value})
    assert getattr(DendriteGrowth(**{flag: False}), flag) is False


@pytest.mark.parametrize("flag", ["log_metrics", "verbose", "restore_best_at_end",
                                  "write_files"])
def test_hugging_face_callback_flags_refuse_non_bools(flag):
    pytest.importorskip("transformers")
    from perfora.integrations.transformers import DendriteGrowthCallback

    with pytest.raises(ConfigError, match=f"{flag} must be True or False, got 'False' "
                                          r"\(a string: write True or False without quotes\)"):
        DendriteGrowthCallback(**{flag: "False"})
    assert getattr(DendriteGrowthCallback(**{flag: False}), flag) is False
