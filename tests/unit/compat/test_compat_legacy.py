"""PerforatedAI's older spelling of the settings: module attributes of GPA (``GPA.x = v``).

PerforatedAI's own MNIST example switches the smoke test off with
``GPA.testing_dendrite_capacity = False``; these tests check that such assignments reach
``GPA.pc`` (and so the tracker), read back, and that a name perfora would ignore is an error.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from perfora import ConfigError, dendritic_layers
from perfora.compat import UnknownSettingError
from perfora.compat import globals_perforatedai as GPA
from perfora.compat import utils_perforatedai as UPA


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """Each test: PerforatedAI's defaults, run folders under tmp_path."""
    monkeypatch.chdir(tmp_path)
    GPA.reset()
    yield
    GPA.reset()


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))


def restructures(model: nn.Module, scores: list[float]) -> list[bool]:
    """Report the scores; whether each epoch restructured."""
    out = []
    for score in scores:
        model, restructured, _ = GPA.pai_tracker.add_validation_score(score, model)
        out.append(restructured)
    return out


def test_module_attribute_switches_the_smoke_test_off():
    GPA.testing_dendrite_capacity = False  # PerforatedAI's MNIST example, as written
    assert GPA.pc.get_testing_dendrite_capacity() is False
    assert GPA.testing_dendrite_capacity is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "this is a smoke test" warning
        model = UPA.perforate_model(build(), save_name="RUN", maximizing_score=True)
    assert GPA.pai_tracker.controller.config.capacity_test is False
    # patience 10 (the default): improving scores for 4 epochs add nothing
    assert restructures(model, [0.5, 0.6, 0.7, 0.8]) == [False] * 4
    assert {layer.num_dendrites for layer in dendritic_layers(model).values()} == {0}


def test_without_it_the_smoke_test_grows_every_epoch():
    with pytest.warns(UserWarning, match="smoke test"):
        model = UPA.perforate_model(build(), save_name="CAP", maximizing_score=True)
    assert GPA.pai_tracker.controller.config.capacity_test is True
    assert restructures(model, [0.5])[0] is True


def test_settings_read_back_in_every_spelling():
    GPA.n_epochs_to_switch = 7
    GPA.MAX_DENDRITES = 2  # the upper-case release
    GPA.switch_mode = GPA.doing_fixed_switch  # the old lower-case constant
    GPA.pb_forward_function = torch.tanh  # renamed pai_forward_function
    GPA.input_dimensions = [-1, -1, 0]  # renamed output_dimensions (no effect in perfora)
    assert (GPA.pc.get_n_epochs_to_switch(), GPA.n_epochs_to_switch, GPA.N_EPOCHS_TO_SWITCH,
            GPA.pc.n_epochs_to_switch) == (7, 7, 7, 7)
    assert GPA.max_dendrites == GPA.pc.get_max_dendrites() == 2
    config = GPA.pc.to_config()
    assert config.switch_mode == "fixed" and config.max_dendrites == 2
    assert config.activation == "tanh" and GPA.pai_forward_function is torch.tanh
    assert GPA.pc.get_output_dimensions() == [-1, -1, 0]
    GPA.reset()
    assert GPA.n_epochs_to_switch == 10 and GPA.testing_dendrite_capacity is True


def test_gpa_pc_attributes_are_settings_too():
    GPA.pc.testing_dendrite_capacity = False  # PAIConfig's attribute, as PerforatedAI has
    GPA.pc.max_dendrites = 3
    assert GPA.pc.get_testing_dendrite_capacity() is False
    assert GPA.pc.to_config().max_dendrites == 3 and GPA.pc.max_dendrites == 3
    with pytest.raises(UnknownSettingError, match="did you mean 'max_dendrites'"):
        GPA.pc.max_dendrite = 3


def test_old_selection_lists_select_the_same_modules():
    class Head(nn.Linear):
        """A layer chosen by class name."""

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv1d(2, 2, 1), nn.Flatten(), nn.Linear(4, 5), Head(5, 2))

    GPA.testing_dendrite_capacity = False
    GPA.modules_to_convert = [nn.Linear]  # only Linear layers (old default: Linear and Conv)
    net = UPA.perforate_model(model(), save_name="A")
    assert sorted(dendritic_layers(net)) == ["2", "3"]
    GPA.reset()
    GPA.testing_dendrite_capacity = False
    GPA.modules_to_convert = []  # no types: only the class names below
    GPA.module_names_to_convert.append("Head")  # a live list, as the old module's was
    assert GPA.pc.get_module_names_to_perforate() == ["PAISequential", "Head"]
    assert GPA.modules_to_convert == [] and GPA.module_names_to_convert == ["PAISequential",
                                                                            "Head"]
    net = UPA.perforate_model(model(), save_name="B")
    assert sorted(dendritic_layers(net)) == ["3"]


def test_unknown_or_refused_attributes_are_errors_naming_the_setting():
    with pytest.raises(UnknownSettingError, match=r"GPA.pc.set_n_epochs_to_switch"):
        GPA.n_epoch_to_switch = 5
    assert not hasattr(GPA, "n_epoch_to_switch") and GPA.pc.get_n_epochs_to_switch() == 10
    with pytest.raises(UnknownSettingError, match=r"GPA.pc.set_testing_dendrite_capacity"):
        GPA.testing_dendrite_capacty = False
    with pytest.raises(UnknownSettingError, match=r"GPA.pc.set_module_ids_to_track"):
        GPA.module_names_to_skip = [".fc"]
    with pytest.raises(ConfigError, match="set_max_dendrites"):
        GPA.max_dendrites = -1  # values are checked as GPA.pc.set_max_dendrites checks them
    with pytest.raises(ConfigError, match="never pickles"):
        GPA.using_safe_tensors = False
    GPA.using_safe_tensors = True  # the default is fine
    with pytest.raises(AttributeError, match="PerforatedAI name"):
        GPA.no_such_thing  # noqa: B018
