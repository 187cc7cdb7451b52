"""What the Lightning and HF growth callbacks share (perfora.integrations._common), without
either framework: the target submodule, perforating once, reading the monitored score, and
the controller's state in a framework checkpoint round-tripping into a fresh model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from perfora import ConfigError, GrowthController, PerforaConfig, dendritic_layers, perforate
from perfora.errors import CheckpointError
from perfora.integrations._common import (
    CONTROLLER_FILE,
    GrowthCallback,
    check_mode,
    controller_state,
    dendrite_counts,
    did_you_mean,
    load_controller_file,
    perforate_once,
    read_score,
    save_controller_file,
)


class Callback(GrowthCallback):
    callback_name = "MyGrowth"
    model_noun = "network"

    def __init__(self, module: str | None = None, **settings) -> None:
        self._init_growth(patience=2, max_dendrites=2, module=module, config=None,
                          perforate_kwargs=None, settings=settings)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        self.head = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def grown_controller(seed: int = 0) -> GrowthController:
    """A controller that has seen scores, kept a best snapshot and grown one set."""
    torch.manual_seed(seed)
    ctl = GrowthController(perforate(Net()), PerforaConfig(save_checkpoints=False),
                           write_files=False, maximize=False, switch_mode="fixed",
                           fixed_switch_num=2, max_dendrites=3)
    for score in (1.0, 0.9, 0.8):
        ctl.step(score)
    assert ctl.num_dendrites == 1 and ctl.best_snapshot is not None
    return ctl


def test_the_target_is_the_model_or_its_submodule_and_a_wrong_path_names_the_children():
    model = Net()
    assert Callback().target(model) is model
    assert Callback(module="body").target(model) is model.body
    with pytest.raises(ConfigError, match=r"MyGrowth\(module='backbone'\): the network has "
                                          r"no such submodule; its children are "
                                          r"\['body', 'head'\]"):
        Callback(module="backbone").target(model)


def test_the_target_is_perforated_once_with_the_configured_activation():
    model = Net()
    callback = Callback(module="body")
    config = callback.growth_config("max")
    assert config.maximize and config.n_epochs_to_switch == 2 and config.max_dendrites == 2
    target = callback._perforate_target(model, config)
    layers = dendritic_layers(target)
    assert target is model.body and set(layers) == {"0", "2"}
    assert not dendritic_layers(model.head)
    callback._perforate_target(model, config)  # already perforated: left as it is
    assert dendritic_layers(model.body) == layers
    assert perforate_once(model.body, {}) is model.body and dendritic_layers(model.body) == layers


def test_settings_are_checked_and_a_bad_mode_is_refused():
    with pytest.raises(ConfigError, match="max_dendrites"):
        Callback(max_dendrites=-1).growth_config("min")  # a setting overrides the argument
    # patience= and mode= are the callback's names: given both ways, one silently won
    with pytest.raises(ConfigError, match=r"\(n_epochs_to_switch=\.\.\.\): this callback "
                                          r"takes patience= for it"):
        Callback(n_epochs_to_switch=5)
    with pytest.raises(ConfigError, match=r"\(maximize=\.\.\.\): this callback takes mode="):
        Callback(maximize=True)
    with pytest.raises(ConfigError, match="mode must be 'min' or 'max', got 'maximum'"):
        check_mode("maximum")
    check_mode("min")
    check_mode("max")


def test_a_score_is_read_as_a_float_from_the_first_name_reported():
    metrics = {"val_acc": torch.tensor(0.75), "eval_loss": 0.5}
    assert read_score(metrics, "val_acc") == 0.75
    assert read_score(metrics, "loss", "eval_loss") == 0.5
    assert read_score(metrics, "val_loss") is None
    assert did_you_mean("val_accuracy", metrics) == " (did you mean 'val_acc'?)"
    assert did_you_mean("zzz", metrics) == ""


def test_the_controller_state_holds_structure_scores_and_best_snapshot_but_no_weights():
    ctl = grown_controller()
    meta, best = controller_state(ctl)
    assert dendrite_counts(meta["structure"]) == {"body.0": 1, "body.2": 1, "head": 1}
    assert {"controller", "rule", "config", "best_structure"} <= set(meta)
    assert best and all(t.device.type == "cpu" for t in best.values())
    fresh = GrowthController(perforate(Net()), write_files=False)
    assert controller_state(fresh)[1] is None  # no best snapshot yet


def test_the_controller_file_gives_a_fresh_model_the_dendrites_and_the_controller_state(
        tmp_path):
    ctl = grown_controller()
    path = tmp_path / CONTROLLER_FILE
    save_controller_file(ctl, path)
    fresh = GrowthController(perforate(Net()), PerforaConfig(save_checkpoints=False),
                             write_files=False)
    load_controller_file(fresh, path)
    assert dendrite_counts(controller_state(fresh)[0]["structure"]) == \
        dendrite_counts(controller_state(ctl)[0]["structure"])
    assert fresh.num_dendrites == 1 and fresh.epoch == ctl.epoch
    assert fresh.best_score == ctl.best_score
    saved_best, restored_best = ctl.best_snapshot[1], fresh.best_snapshot[1]
    assert saved_best.keys() == restored_best.keys()
    assert all(torch.equal(saved_best[k].cpu(), restored_best[k]) for k in saved_best)


def test_a_controller_file_is_a_perfora_checkpoint_and_a_pickle_is_refused(tmp_path):
    path = tmp_path / CONTROLLER_FILE
    torch.save({"structure": {}}, path)
    with pytest.raises(CheckpointError, match="pickle"):
        load_controller_file(GrowthController(perforate(Net()), write_files=False), path)
