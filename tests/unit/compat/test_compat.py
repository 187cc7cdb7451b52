"""perfora.compat in process: GPA.pc settings, the tracker calls, save/load, missing names.

Real models and real controllers; scores are scripted so decisions are known in advance.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors import safe_open
from torch import nn

from perfora import (
    ConfigError,
    OrderError,
    PerforaConfig,
    PerforationError,
    dendritic_layers,
    perforate,
)
from perfora.compat import CompatNameError, UnknownSettingError
from perfora.compat import globals_perforatedai as GPA
from perfora.compat import utils_perforatedai as UPA
from perfora.compat.tracker import COMPLETE_MARKER, SETTINGS_FILE


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """Each test: defaults, no tracker, run folders under tmp_path."""
    monkeypatch.chdir(tmp_path)
    reset_settings()
    yield
    GPA.reset()


def reset_settings() -> None:
    """Defaults, with the capacity smoke test off (as every real script sets it)."""
    GPA.reset()
    GPA.pc.set_testing_dendrite_capacity(False)


def build(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))


def counts(model: nn.Module) -> set[int]:
    return {layer.num_dendrites for layer in dendritic_layers(model).values()}


def perforated(save_name: str = "RUN", **kw) -> nn.Module:
    return UPA.perforate_model(build(), save_name=save_name, maximizing_score=True, **kw)


def train_a_bit(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(32, 4, generator=gen), torch.randint(0, 3, (32,), generator=gen)
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


# ------------------------------------------------------------------- settings
LISTED = {  # every setting the issue names, with a non-default value
    "n_epochs_to_switch": 7, "max_dendrites": 3, "max_dendrite_tries": 4,
    "switch_mode": GPA.pc.DOING_FIXED_SWITCH, "fixed_switch_num": 5,
    "improvement_threshold": [0.01, 0.001], "improvement_threshold_raw": 1e-3,
    "history_lookback": 2, "maximizing_score": False, "testing_dendrite_capacity": True,
    "retain_all_dendrites": True, "modules_to_perforate": [nn.Linear],
    "module_names_to_perforate": ["Linear"], "module_ids_to_perforate": [".0"],
    "modules_to_track": [nn.Conv2d], "save_name": "elsewhere", "verbose": True,
    "silent": True,
}


def test_every_listed_setting_round_trips_through_set_and_get():
    for name, value in LISTED.items():
        getattr(GPA.pc, f"set_{name}")(value)
        assert getattr(GPA.pc, f"get_{name}")() == value, name
    GPA.pc.set_module_names_to_track(["BatchNorm1d"])
    GPA.pc.set_module_ids_to_track([".2"])
    assert GPA.pc.get_module_names_to_track() == ["BatchNorm1d"]
    assert GPA.pc.get_module_ids_to_track() == [".2"]
    GPA.pc.append_module_names_to_perforate(["Conv2d"])
    assert GPA.pc.get_module_names_to_perforate() == ["Linear", "Conv2d"]


def test_switch_mode_constants_and_translation():
    pc = GPA.pc
    assert (pc.DOING_SWITCH_EVERY_TIME, pc.DOING_HISTORY, pc.DOING_FIXED_SWITCH,
            pc.DOING_NO_SWITCH) == (0, 1, 2, 3)
    assert GPA.DOING_HISTORY == pc.DOING_HISTORY
    expected = {pc.DOING_SWITCH_EVERY_TIME: "every_epoch", pc.DOING_HISTORY: "patience",
                pc.DOING_FIXED_SWITCH: "fixed", pc.DOING_NO_SWITCH: "never"}
    for mode, name in expected.items():
        pc.set_switch_mode(mode)
        assert pc.to_config().switch_mode == name
    with pytest.raises(ConfigError, match="DOING_HISTORY"):
        pc.set_switch_mode(7)
    assert pc.get_switch_mode() == pc.DOING_NO_SWITCH  # the bad value was not kept


def test_settings_translate_into_perfora_config():
    for name in ("n_epochs_to_switch", "max_dendrites", "max_dendrite_tries", "switch_mode",
                 "fixed_switch_num", "improvement_threshold", "improvement_threshold_raw",
                 "history_lookback", "maximizing_score", "retain_all_dendrites"):
        getattr(GPA.pc, f"set_{name}")(LISTED[name])
    cfg = GPA.pc.to_config()
    assert isinstance(cfg, PerforaConfig)
    assert (cfg.n_epochs_to_switch, cfg.max_dendrites, cfg.max_dendrite_tries,
            cfg.fixed_switch_num, cfg.history_lookback) == (7, 3, 4, 5, 2)
    assert cfg.switch_mode == "fixed" and cfg.maximize is False and cfg.retain_all_dendrites
    assert cfg.improvement_threshold == (0.01, 0.001)
    assert cfg.improvement_threshold_raw == 1e-3
    GPA.pc.set_pai_forward_function(torch.tanh)
    GPA.pc.set_candidate_weight_initialization_multiplier(0.05)
    cfg = GPA.pc.to_config()
    assert cfg.activation == "tanh"
    assert (cfg.dendrite_init, cfg.dendrite_init_scale) == ("normal", 0.05)


def test_capacity_test_is_the_pai_default_and_max_dendrites_zero_is_the_baseline():
    GPA.reset()
    assert GPA.pc.get_testing_dendrite_capacity() is True
    assert GPA.pc.to_config().capacity_test is True
    GPA.pc.set_max_dendrites(0)
    cfg = GPA.pc.to_config()
    assert cfg.max_dendrites == 0 and cfg.capacity_test is False


def test_unknown_setting_names_the_nearest_one():
    with pytest.raises(UnknownSettingError, match="'n_epochs_to_switch'"):
        GPA.pc.set_n_epoch_to_switch(3)
    with pytest.raises(UnknownSettingError, match="'max_dendrites'"):
        GPA.pc.get_max_dendrite()
    with pytest.raises(ConfigError):  # also a ConfigError (and an AttributeError)
        GPA.pc.set_testing_dendrite_capasity(False)
    assert not hasattr(GPA.pc, "set_no_such_setting")
    assert GPA.pc.n_epochs_to_switch == 10  # PAIConfig's attribute spelling reads it
    with pytest.raises(CompatNameError, match="get_<name>"):
        GPA.pc.n_epoch_to_switch  # noqa: B018


def test_bad_and_unsupported_values_are_errors_naming_the_setting():
    with pytest.raises(ConfigError, match="set_max_dendrites"):
        GPA.pc.set_max_dendrites(-1)
    assert GPA.pc.get_max_dendrites() == 100
    with pytest.raises(ConfigError, match="set_n_epochs_to_switch"):
        GPA.pc.set_n_epochs_to_switch("ten")
    with pytest.raises(ConfigError, match="never pickles"):
        GPA.pc.set_using_safe_tensors(False)
    GPA.pc.set_using_safe_tensors(True)  # the default is fine
    with pytest.raises(ConfigError, match="not supported"):
        GPA.pc.set_global_candidates(4)
    with pytest.raises(ConfigError, match="pai_forward_function"):
        GPA.pc.set_pai_forward_function(torch.exp)
    GPA.pc.set_unwrapped_modules_confirmed(True)  # accepted: perfora never asks anyway
    assert GPA.pc.get_unwrapped_modules_confirmed() is True


# -------------------------------------------------------------- missing names
def test_names_perfora_lacks_raise_clear_attribute_errors():
    with pytest.raises(CompatNameError, match="prepare_final_model.*perfora.save_model"):
        UPA.prepare_final_model(nn.Linear(2, 2))
    with pytest.raises(AttributeError, match="utils_perforatedai has no name .no_such_call."):
        UPA.no_such_call  # noqa: B018
    with pytest.raises(CompatNameError, match="did you mean .*load_system"):
        UPA.load_sytem  # noqa: B018
    with pytest.raises(CompatNameError, match="member_vars"):
        GPA.pai_tracker.member_vars  # noqa: B018
    with pytest.raises(CompatNameError, match="did you mean 'add_test_score'"):
        GPA.pai_tracker.add_tset_score(1.0)
    assert not hasattr(GPA, "PAIConfig") and hasattr(GPA, "pai_tracker")


def test_tracker_calls_before_perforate_model_say_what_to_do():
    with pytest.raises(OrderError, match="perforate_model"):
        GPA.pai_tracker.add_validation_score(0.5, build())
    with pytest.raises(OrderError, match="perforate_model"):
        GPA.pai_tracker.save_tracker_settings()


# --------------------------------------------------------------- conversion
def test_perforate_model_follows_the_module_lists():
    model = perforated()
    assert sorted(dendritic_layers(model)) == ["0", "2"]
    reset_settings()
    GPA.pc.set_module_ids_to_track([".2"])
    model = UPA.perforate_model(build(), save_name="B")
    assert sorted(dendritic_layers(model)) == ["0"]
    reset_settings()
    GPA.pc.set_module_names_to_perforate([])
    GPA.pc.set_module_ids_to_perforate([".2"])
    model = UPA.perforate_model(build(), save_name="C")
    assert sorted(dendritic_layers(model)) == ["2"]
    assert GPA.pc.get_save_name() == "C"


def test_pai_sequential_groups_a_layer_with_its_norm():
    torch.manual_seed(0)
    net = nn.Sequential(GPA.PAISequential([nn.Linear(4, 6), nn.BatchNorm1d(6)]), nn.ReLU(),
                        nn.Linear(6, 2))
    x = torch.randn(8, 4)
    net.eval()
    before = net(x)
    UPA.perforate_model(net, save_name="SEQ")
    layers = dendritic_layers(net)
    assert sorted(layers) == ["0.0", "2"] and layers["0.0"].grouped_with == "0.1"
    assert torch.equal(net(x), before)


def test_initialize_pai_is_the_older_name():
    model = UPA.initialize_pai(build(), save_name="OLD")
    assert dendritic_layers(model) and GPA.pai_tracker.controller is not None


# ---------------------------------------------------------------- optimizer
def test_setup_optimizer_keeps_types_and_arguments_and_rebuilds_after_growth():
    GPA.pc.set_switch_mode(GPA.pc.DOING_SWITCH_EVERY_TIME)
    model = perforated()
    GPA.pai_tracker.set_optimizer(torch.optim.Adam)
    GPA.pai_tracker.set_scheduler(torch.optim.lr_scheduler.StepLR)
    optimArgs = {"params": model.parameters(), "lr": 0.003, "weight_decay": 1e-4}
    schedArgs = {"step_size": 30, "gamma": 0.1}
    optimizer, scheduler = GPA.pai_tracker.setup_optimizer(model, optimArgs, schedArgs)
    assert type(optimizer) is torch.optim.Adam
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (0.003, 1e-4)
    assert (scheduler.step_size, scheduler.gamma) == (30, 0.1)
    assert len(group["params"]) == len(list(model.parameters()))
    model, restructured, complete = GPA.pai_tracker.add_validation_score(0.5, model)
    assert restructured and not complete and counts(model) == {1}
    optimArgs = {"params": model.parameters(), "lr": 0.003, "weight_decay": 1e-4}
    optimizer, _ = GPA.pai_tracker.setup_optimizer(model, optimArgs, schedArgs)
    assert {id(p) for p in optimizer.param_groups[0]["params"]} == \
        {id(p) for p in model.parameters()}


def test_setup_optimizer_errors():
    model = perforated()
    with pytest.raises(OrderError, match="set_optimizer"):
        GPA.pai_tracker.setup_optimizer(model, {"lr": 0.1})
    with pytest.raises(ConfigError, match="optimizer class"):
        GPA.pai_tracker.set_optimizer(torch.optim.Adam(model.parameters()))
    GPA.pai_tracker.set_optimizer(torch.optim.SGD)
    groups = [{"params": list(model.parameters()), "lr": 0.1}]
    with pytest.raises(ConfigError, match="parameter groups"):
        GPA.pai_tracker.setup_optimizer(model, {"params": groups, "lr": 0.1})
    with pytest.raises(OrderError, match="different model"):
        GPA.pai_tracker.setup_optimizer(build(), {"lr": 0.1})


def test_set_optimizer_instance_is_the_quick_start_path():
    GPA.pc.set_switch_mode(GPA.pc.DOING_SWITCH_EVERY_TIME)
    model = perforated()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    GPA.pai_tracker.set_optimizer_instance(optimizer)
    assert GPA.pai_tracker.controller.optimizer is optimizer
    _, restructured, _ = GPA.pai_tracker.add_validation_score(0.4, model)
    assert restructured and GPA.pai_tracker.controller.optimizer is None


# ------------------------------------------------------------------- scores
def test_add_validation_score_returns_what_it_was_given():
    GPA.pc.set_switch_mode(GPA.pc.DOING_FIXED_SWITCH)
    GPA.pc.set_fixed_switch_num(2)
    model = perforated()
    wrapped = nn.DataParallel(model)
    out, restructured, _ = GPA.pai_tracker.add_validation_score(0.5, wrapped)
    assert out is wrapped and not restructured  # no change: the same wrapper
    out, restructured, _ = GPA.pai_tracker.add_validation_score(0.6, wrapped)
    assert restructured and type(out) is nn.DataParallel and out is not wrapped
    assert out.module is model and counts(out) == {1}
    inner, _, _ = GPA.pai_tracker.add_validation_score(0.7, out.module)
    assert inner is model


def test_scores_reach_the_run_files_and_complete_writes_the_marker():
    GPA.pc.set_switch_mode(GPA.pc.DOING_FIXED_SWITCH)
    GPA.pc.set_fixed_switch_num(2)
    GPA.pc.set_max_dendrites(1)
    model = perforated()
    results = []
    for epoch, score in enumerate([0.5, 0.6, 0.7, 0.8, 0.9]):
        GPA.pai_tracker.add_extra_score(epoch / 10, "Train Acc")
        GPA.pai_tracker.add_extra_score_without_graphing(epoch, "Step")
        GPA.pai_tracker.add_test_score(score - 0.05, "Test Acc")
        model, restructured, complete = GPA.pai_tracker.add_validation_score(score, model)
        results.append((restructured, complete))
        if complete:
            break
    assert results == [(False, False), (True, False), (False, False), (True, True)]
    assert (GPA.pai_tracker.save_dir / COMPLETE_MARKER).is_file()
    header = (GPA.pai_tracker.save_dir / "metrics.csv").read_text().splitlines()[0]
    assert "extra/Train Acc" in header and "extra/Step" in header and "test_score" in header


def test_baseline_stops_at_the_plateau_without_dendrites():
    GPA.pc.set_max_dendrites(0)
    GPA.pc.set_n_epochs_to_switch(2)
    model = perforated()
    outcomes = [GPA.pai_tracker.add_validation_score(s, model)[1:] for s in (0.5, 0.5, 0.5)]
    assert outcomes[-1] == (True, True) and counts(model) == {0}
    assert not list((GPA.pai_tracker.save_dir).glob("switch_*.pt"))


def test_doing_pai_false_is_the_baseline_too():
    GPA.pc.set_switch_mode(GPA.pc.DOING_SWITCH_EVERY_TIME)
    model = UPA.perforate_model(build(), doing_pai=False, save_name="BASE")
    _, restructured, complete = GPA.pai_tracker.add_validation_score(0.5, model)
    assert complete and counts(model) == {0}


def test_force_switch_adds_dendrites_now():
    model = perforated()
    _, restructured, complete = GPA.pai_tracker.add_validation_score(0.5, model,
                                                                     force_switch=True)
    assert restructured and not complete and counts(model) == {1}


def test_settings_changed_after_perforate_model_apply():
    model = perforated()
    for score in (0.5, 0.6):
        assert GPA.pai_tracker.add_validation_score(score, model)[1] is False
    GPA.pc.set_switch_mode(GPA.pc.DOING_SWITCH_EVERY_TIME)
    assert GPA.pai_tracker.add_validation_score(0.7, model)[1] is True


# ---------------------------------------------------------------- save/load
def _grow_and_train(model: nn.Module) -> None:
    GPA.pai_tracker.set_optimizer(torch.optim.Adam)
    optimizer, _ = GPA.pai_tracker.setup_optimizer(model, {"params": model.parameters(),
                                                           "lr": 0.01})
    for score in (0.5, 0.6, 0.7):
        train_a_bit(model, optimizer)
        model, restructured, _ = GPA.pai_tracker.add_validation_score(score, model)
        if restructured:
            optimizer, _ = GPA.pai_tracker.setup_optimizer(model, {"lr": 0.01})
    train_a_bit(model, optimizer, seed=1)


def test_save_system_load_system_restore_structure_weights_and_tracker():
    GPA.pc.set_switch_mode(GPA.pc.DOING_SWITCH_EVERY_TIME)
    GPA.pc.set_retain_all_dendrites(True)
    model = perforated()
    _grow_and_train(model)
    path = UPA.save_system(model, "RUN", "manual")
    assert path.name == "manual.pt" and path.is_file()
    x = torch.randn(6, 4)
    expected = model(x)
    state = GPA.pai_tracker.controller.state

    reset_settings()
    GPA.pc.set_switch_mode(GPA.pc.DOING_SWITCH_EVERY_TIME)
    fresh = UPA.perforate_model(build(seed=5), save_name="RUN2", maximizing_score=True)
    assert counts(fresh) == {0}
    loaded = UPA.load_system(fresh, "RUN", "manual", True)
    assert loaded is fresh and counts(fresh) == {3}
    assert torch.equal(fresh(x), expected)
    got = GPA.pai_tracker.controller.state
    assert (got.epoch, got.switch_epochs, got.global_best) == \
        (state.epoch, state.switch_epochs, state.global_best)

    # weights only, into a model no tracker runs
    other = UPA.load_system(build(seed=7), "RUN", "manual")
    assert counts(other) == {3} and torch.equal(other(x), expected)
    with pytest.raises(OrderError, match="perforate_model"):
        UPA.load_system(build(seed=7), "RUN", "manual", True)


def test_switch_best_and_latest_files_hold_safetensors():
    GPA.pc.set_switch_mode(GPA.pc.DOING_SWITCH_EVERY_TIME)
    GPA.pc.set_retain_all_dendrites(True)
    model = perforated()
    _grow_and_train(model)
    folder = GPA.pai_tracker.save_dir
    names = sorted(p.name for p in folder.glob("*.pt"))
    assert names == ["best_model.pt", "latest.pt", "switch_1.pt", "switch_2.pt", "switch_3.pt"]
    for name in names:
        with safe_open(str(folder / name), framework="pt") as handle:
            assert any(key.startswith("model/") for key in handle.keys())
    # the PerforatedAI recipe's loader takes the highest N: that is the newest structure
    reset_settings()
    fresh = UPA.perforate_model(build(), save_name="RUN3")
    UPA.load_system(fresh, str(folder), "switch_3", True)
    assert counts(fresh) == {3} and GPA.pai_tracker.controller.epoch == 3


# ------------------------------------------------------- multi-GPU settings
def test_tracker_settings_round_trip_and_are_optional():
    GPA.pc.set_n_epochs_to_switch(4)
    GPA.pc.set_switch_mode(GPA.pc.DOING_FIXED_SWITCH)
    model = perforated()
    assert GPA.pai_tracker.initialize_tracker_settings() is None  # no init run: fine
    path = GPA.pai_tracker.save_tracker_settings()
    assert path.name == SETTINGS_FILE
    saved = json.loads(path.read_text())
    assert saved["settings"]["n_epochs_to_switch"] == 4
    assert saved["settings"]["switch_mode"] == GPA.pc.DOING_FIXED_SWITCH
    assert saved["settings"]["modules_to_perforate"] == []
    assert saved["layers"] == {"0": {"neurons": 5, "dendrites": 0},
                               "2": {"neurons": 3, "dendrites": 0}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert GPA.pai_tracker.initialize_tracker_settings() == saved
    GPA.pc.set_n_epochs_to_switch(9)
    with pytest.warns(UserWarning, match="n_epochs_to_switch"):
        GPA.pai_tracker.initialize_tracker_settings()
    assert GPA.pc.get_n_epochs_to_switch() == 9 and model is not None


def test_capacity_warning_is_given_when_left_on():
    GPA.reset()
    with pytest.warns(UserWarning, match="set_testing_dendrite_capacity"):
        UPA.perforate_model(build(), save_name="CAP")


def test_load_system_after_setup_optimizer_warns():
    model = perforated()
    UPA.save_system(model, "RUN", "early")
    GPA.pai_tracker.set_optimizer(torch.optim.SGD)
    GPA.pai_tracker.setup_optimizer(model, {"params": model.parameters(), "lr": 0.1})
    with pytest.warns(UserWarning, match="setup_optimizer again"):
        UPA.load_system(model, "RUN", "early", True)


def test_perforated_backpropagation_selects_the_correlation_rule():
    assert GPA.pc.to_config().rule == "gd"
    GPA.pc.set_perforated_backpropagation(True)
    try:
        assert GPA.pc.get_perforated_backpropagation() is True
        assert GPA.pc.to_config().rule == "correlation"
    finally:
        GPA.pc.set_perforated_backpropagation(False)


def test_selection_and_save_name_set_after_perforate_model_warn_growth_settings_do_not():
    model = perforated("RUN")
    with pytest.warns(UserWarning, match=r"set_save_name after UPA.perforate_model changes "
                                         r"nothing for this run: its run folder was chosen"):
        GPA.pc.set_save_name("B")
    with pytest.warns(UserWarning, match="the modules were chosen by perforate_model"):
        GPA.pc.set_module_ids_to_track([".0"])
    assert set(dendritic_layers(model)) == {"0", "2"}  # what perforate_model chose stays
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GPA.pc.set_n_epochs_to_switch(3)  # applies from the next epoch: no warning
        reset_settings()
        GPA.pc.set_save_name("C")  # a new run's settings, before its perforate_model
        perforated("C")


class BasicBlock(nn.Module):
    """A residual block perfora cannot size without an example input."""

    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x)) + x)


class ResidualBlock(nn.Module):
    """A residual block without a norm: perfora cannot size it by itself."""

    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) + x)


def _net(block: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), block, nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 2))


def test_a_block_perfora_cannot_size_names_the_way_under_the_compat_names():
    GPA.pc.append_module_names_to_perforate(["ResidualBlock"])
    with pytest.raises(PerforationError,
                       match=r"perforate_model has neither argument .*perfora\.perforate\("
                             r"model, names=\('<class>',\), neuron_axes="):
        UPA.perforate_model(_net(ResidualBlock()), save_name="RUN")
    model = _net(ResidualBlock())
    perforate(model, names=("ResidualBlock",), neuron_axes={"ResidualBlock": 1},
              example_input=torch.randn(2, 3, 8, 8))
    model = UPA.perforate_model(model, save_name="RUN")
    kinds = {p: type(m).__name__ for p, m in dendritic_layers(model).items()}
    assert kinds == {"0": "ConvDendriticLayer", "1": "GenericDendriticLayer",
                     "4": "LinearDendriticLayer"}


def test_a_block_holding_a_batch_norm_is_refused_with_the_compat_way_in():
    GPA.pc.append_module_names_to_perforate(["BasicBlock"])
    with pytest.raises(PerforationError, match=r"running statistics.*take the class out of "
                                               r"GPA.module_names_to_convert"):
        UPA.perforate_model(_net(BasicBlock()), save_name="RUN")


def test_an_unknown_setting_message_reads_as_one_sentence():
    with pytest.raises(UnknownSettingError,
                       match=r"did you mean 'max_dendrites'\? Known settings"):
        GPA.pc.set_max_dendrties(3)


def test_natural_slips_with_the_tracker_are_named():
    model = perforated("RUN")
    with pytest.raises(ConfigError, match="not an optimizer you built: register that one with "
                                          r"GPA.pai_tracker.set_optimizer_instance"):
        GPA.pai_tracker.set_optimizer(torch.optim.Adam(model.parameters()))
    GPA.pai_tracker.set_optimizer(torch.optim.Adam)
    with pytest.warns(UserWarning, match="got schedArgs but no scheduler class is registered"):
        _, scheduler = GPA.pai_tracker.setup_optimizer(model, {"lr": 1e-3}, {"step_size": 2})
    assert scheduler is None
    with pytest.raises(CompatNameError, match=r"has no name 'foo_bar': it is not among the "
                                              r"PerforatedAI names perfora provides"):
        GPA.foo_bar  # noqa: B018


def test_checkpoint_time_budget_is_a_gpa_pc_setting_too():
    GPA.pc.set_checkpoint_time_budget(None)
    assert GPA.pc.to_config().checkpoint_time_budget is None
    with pytest.raises(ConfigError, match="checkpoint_time_budget must be a fraction"):
        GPA.pc.set_checkpoint_time_budget(-1)
    assert GPA.pc.get_checkpoint_time_budget() is None  # a refused value leaves the old one


def test_the_recipes_load_before_setup_optimizer_gives_no_native_scheduler_advice():
    # it warned "none is registered here ... controller.set_scheduler(...) before load()":
    # native advice, where the recipe builds a fresh optimizer and scheduler after the load
    # (as PerforatedAI does)
    model = perforated()
    GPA.pai_tracker.set_optimizer(torch.optim.SGD)
    GPA.pai_tracker.set_scheduler(torch.optim.lr_scheduler.StepLR)
    optimizer, scheduler = GPA.pai_tracker.setup_optimizer(model, {"lr": 0.1},
                                                           {"step_size": 1, "gamma": 0.5})
    for score in (0.1, 0.2):
        train_a_bit(model, optimizer)
        model, _, _ = GPA.pai_tracker.add_validation_score(score, model)
    UPA.save_system(model, "RUN", "mid")
    reset_settings()
    fresh = UPA.perforate_model(build(), save_name="RUN4", maximizing_score=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        UPA.load_system(fresh, "RUN", "mid", True)
        GPA.pai_tracker.set_optimizer(torch.optim.SGD)
        GPA.pai_tracker.set_scheduler(torch.optim.lr_scheduler.StepLR)
        _, scheduler = GPA.pai_tracker.setup_optimizer(fresh, {"lr": 0.1},
                                                       {"step_size": 1, "gamma": 0.5})
    assert scheduler.last_epoch == 0  # fresh, as PerforatedAI's recipe builds it
