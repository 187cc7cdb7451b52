"""``GPA.pc``: PerforatedAI-style settings (``set_x``/``get_x``/``append_x``) over PerforaConfig.

Every PerforatedAI setting perfora knows has a default and a kind:

- ``config``: translated into :class:`perfora.PerforaConfig` (the controller's settings);
- ``convert``: decides which modules :func:`perfora.perforate` wraps;
- ``run``: the run folder and how much is printed;
- ``accepted``: stored and returned, with no effect, because perfora has nothing to switch
  off (it never prompts, never stops in a debugger, reads neuron axes from the layer type);
- ``unsupported``: only the default value is accepted; another value is an error saying
  what perfora does instead.

An unknown name is an error naming the nearest known setting.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..config import PerforaConfig, nearest_name
from ..errors import CompatNameError, ConfigError, UnknownSettingError
from ..warn import warn_user

DOING_SWITCH_EVERY_TIME = 0
DOING_HISTORY = 1
DOING_FIXED_SWITCH = 2
DOING_NO_SWITCH = 3
SWITCH_MODES = {DOING_SWITCH_EVERY_TIME: "every_epoch", DOING_HISTORY: "patience",
                DOING_FIXED_SWITCH: "fixed", DOING_NO_SWITCH: "never"}
NEVER_COMPLETES = 10 ** 9
"""Patience used for DOING_NO_SWITCH, which never adds dendrites and never completes."""


@dataclass(frozen=True)
class Spec:
    """Default value, kind and (for accepted/unsupported settings) why."""

    default: Any
    kind: str
    note: str = ""


_NO_PROMPTS = "perfora never prompts, stops in a debugger or exits"
_GRAPHS = "perfora writes metrics.csv and history.png (at restructures and at the end)"
_NO_SWEEP = ("perfora has no learning-rate sweep: after a restructure the optimizer and "
             "scheduler restart from the arguments you gave")
_ONE_TENSOR = ("perfora wraps modules that map one tensor to one tensor; wrap other modules "
               "with perfora.perforate(model, neuron_axes=...)")

SETTINGS: dict[str, Spec] = {
    # -- translated into PerforaConfig
    "switch_mode": Spec(DOING_HISTORY, "config"),
    "n_epochs_to_switch": Spec(10, "config"),
    "max_dendrites": Spec(100, "config"),
    "max_dendrite_tries": Spec(2, "config"),
    "fixed_switch_num": Spec(250, "config"),
    "improvement_threshold": Spec([0.001, 0.0001, 0.0], "config"),
    "improvement_threshold_raw": Spec(1e-5, "config"),
    "history_lookback": Spec(1, "config"),
    "maximizing_score": Spec(True, "config"),
    "testing_dendrite_capacity": Spec(True, "config"),
    "retain_all_dendrites": Spec(False, "config"),
    "pai_forward_function": Spec(torch.sigmoid, "config"),
    "candidate_weight_initialization_multiplier": Spec(0.01, "config"),
    "perforated_backpropagation": Spec(False, "config"),  # True: rule="correlation"
    "checkpoint_time_budget": Spec(0.05, "config"),  # perfora's own: how often latest.pt
    # -- which modules get dendrites
    "modules_to_perforate": Spec([], "convert"),
    "module_names_to_perforate": Spec(
        ["PAISequential", "Conv1d", "Conv2d", "Conv3d", "Linear"], "convert"),
    "module_ids_to_perforate": Spec([], "convert"),
    "modules_to_track": Spec([], "convert"),
    "module_names_to_track": Spec([], "convert"),
    "module_ids_to_track": Spec([], "convert"),
    # -- run folder and output
    "save_name": Spec("PAI", "run"),
    "verbose": Spec(False, "run"),
    "silent": Spec(False, "run"),
    # -- accepted, no effect in perfora
    "unwrapped_modules_confirmed": Spec(False, "accepted", _NO_PROMPTS),
    "checked_skipped_modules": Spec(False, "accepted", _NO_PROMPTS),
    "weight_decay_accepted": Spec(True, "accepted", _NO_PROMPTS),
    "configuration_confirmed": Spec(False, "accepted", _NO_PROMPTS),
    "confirm_correct_sizes": Spec(False, "accepted", _NO_PROMPTS),
    "output_dimensions": Spec([-1, 0, -1, -1], "accepted",
                              "perfora reads the neuron axis from the layer type (last axis "
                              "for Linear, axis 1 for Conv); for other modules, perforate "
                              "them first with perfora.perforate(model, names=..., "
                              "neuron_axes=..., example_input=...)"),
    "debugging_output_dimensions": Spec(0, "accepted", _NO_PROMPTS),
    "extra_verbose": Spec(False, "accepted", "perfora logs through the 'perfora' logger"),
    "drawing_pai": Spec(True, "accepted", _GRAPHS),
    "drawing_extra_graphs": Spec(True, "accepted", _GRAPHS),
    "save_old_graph_scores": Spec(True, "accepted", _GRAPHS),
    "test_saves": Spec(True, "accepted",
                       "perfora writes latest.pt within checkpoint_time_budget (default 5% "
                       "of the run time), and always at restructures and at the end"),
    "pai_saves": Spec(False, "accepted", "perfora models need no separate clean copy"),
    "find_best_lr": Spec(True, "accepted", _NO_SWEEP),
    "dont_give_up_unless_learning_rate_lowered": Spec(True, "accepted", _NO_SWEEP),
    "param_vals_setting": Spec(1, "accepted", _NO_SWEEP),
    "reset_best_score_on_switch": Spec(True, "accepted",
                                       "perfora always starts a new cycle's best score afresh"),
    "module_names_to_not_save": Spec([".base_model"], "accepted",
                                     "perfora saves each module once, aliases included"),
    "parameter_ids_to_track": Spec([], "accepted",
                                   "perfora needs no list of parameters outside dendrites"),
    "device": Spec(None, "accepted", "perfora follows the model's device"),
    "use_cuda": Spec(None, "accepted", "perfora follows the model's device"),
    "d_type": Spec(torch.float32, "accepted", "perfora follows the model's dtype"),
    "learn_dendrites_live": Spec(False, "accepted", "only used by Perforated Backpropagation"),
    "no_extra_n_modes": Spec(True, "accepted", "only used by Perforated Backpropagation"),
    # -- only the default value is accepted
    "using_safe_tensors": Spec(True, "unsupported",
                               "perfora always writes safetensors and never pickles"),
    "strict_loading": Spec(True, "unsupported",
                           "perfora always checks that a checkpoint fits the model"),
    "initial_history_after_switches": Spec(0, "unsupported",
                                           "perfora has no grace epochs after a switch"),
    "first_fixed_switch_num": Spec(-1, "unsupported",
                                   "in fixed mode every cycle lasts fixed_switch_num epochs"),
    "global_candidates": Spec(1, "unsupported", "one dendrite set is added at a time"),
    "candidate_weight_init_by_main": Spec(False, "unsupported",
                                          "use candidate_weight_initialization_multiplier"),
    "modules_to_replace": Spec([], "unsupported",
                               "replace modules yourself before UPA.perforate_model"),
    "replacement_modules": Spec([], "unsupported",
                                "replace modules yourself before UPA.perforate_model"),
    "modules_with_processing": Spec([], "unsupported", _ONE_TENSOR),
    "modules_processing_classes": Spec([], "unsupported", _ONE_TENSOR),
    "module_names_with_processing": Spec([], "unsupported", _ONE_TENSOR),
    "module_by_name_processing_classes": Spec([], "unsupported", _ONE_TENSOR),
}

_ACTIVATIONS: dict[Any, str] = {torch.sigmoid: "sigmoid", torch.tanh: "tanh",
                                torch.relu: "relu", F.relu: "relu", F.sigmoid: "sigmoid",
                                F.tanh: "tanh"}
_PREFIXES = ("set_", "get_", "append_")


def activation_name(value: Any) -> str:
    """perfora's activation name for a PerforatedAI ``pai_forward_function`` value."""
    if isinstance(value, str) and value in ("sigmoid", "tanh", "relu"):
        return value
    try:
        return _ACTIVATIONS[value]
    except (KeyError, TypeError):
        raise ConfigError(f"pai_forward_function {value!r} is not supported; use torch.sigmoid, "
                          "torch.tanh or torch.relu (or 'sigmoid', 'tanh', 'relu')") from None


class PAISettings:
    """The settings object ``GPA.pc``: ``set_x(v)``, ``get_x()``, ``append_x(list)``."""

    DOING_SWITCH_EVERY_TIME = DOING_SWITCH_EVERY_TIME
    DOING_HISTORY = DOING_HISTORY
    DOING_FIXED_SWITCH = DOING_FIXED_SWITCH
    DOING_NO_SWITCH = DOING_NO_SWITCH

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._explicit: set[str] = set()
        self.reset()

    def reset(self) -> None:
        """Every setting back to its PerforatedAI default."""
        self._values = {name: copy.copy(spec.default) for name, spec in SETTINGS.items()}
        self._explicit = set()
        self._perforated = False  # UPA.perforate_model has used the selection and save_name

    # ----------------------------------------------------------------- access
    def get(self, name: str) -> Any:
        """The value of setting ``name``."""
        return self._values[self._known(name)]

    def set(self, name: str, value: Any) -> None:
        """Set ``name``; invalid values raise ConfigError naming the setting."""
        name = self._known(name)
        spec = SETTINGS[name]
        if spec.kind == "unsupported" and value != spec.default:
            raise ConfigError(f"GPA.pc.set_{name}({value!r}) is not supported by perfora: "
                              f"{spec.note}. Only the default {spec.default!r} is accepted")
        if isinstance(spec.default, list) and not isinstance(value, list | tuple):
            if name != "improvement_threshold":
                raise ConfigError(f"GPA.pc.set_{name} needs a list, got {value!r}")
        old = self._values[name]
        self._values[name] = list(value) if isinstance(value, list | tuple) else value
        try:
            self._validate(name)
        except ConfigError as exc:
            self._values[name] = old
            raise ConfigError(f"GPA.pc.set_{name}({value!r}): {exc}") from None
        self._explicit.add(name)
        if self._perforated and (spec.kind == "convert" or name == "save_name"):
            what = "its run folder was" if name == "save_name" else "the modules were"
            warn_user(f"GPA.pc.set_{name} after UPA.perforate_model changes nothing for this "
                      f"run: {what} chosen by perforate_model; set it before that call")

    def mark_perforated(self, done: bool) -> None:
        """UPA.perforate_model has (True) or has not yet (False) used the module selection
        and save_name: setting those afterwards warns that it changes nothing."""
        self._perforated = done

    def append(self, name: str, values: Any) -> None:
        """Extend a list setting, as PerforatedAI's ``append_x`` does."""
        name = self._known(name)
        current = self._values[name]
        if not isinstance(current, list):
            raise ConfigError(f"GPA.pc.append_{name}: {name} is not a list setting; use "
                              f"GPA.pc.set_{name}")
        extra = list(values) if isinstance(values, list | tuple) else [values]
        self.set(name, current + extra)

    def is_set(self, name: str) -> bool:
        """True when the script set ``name`` itself (not left at its default)."""
        return self._known(name) in self._explicit

    def _known(self, name: str) -> str:
        if name in SETTINGS:
            return name
        raise UnknownSettingError(unknown_setting_message(name))

    def _validate(self, name: str) -> None:
        kind = SETTINGS[name].kind
        if name == "switch_mode" and self._values[name] not in SWITCH_MODES:
            raise ConfigError("use GPA.pc.DOING_HISTORY, DOING_FIXED_SWITCH, "
                              "DOING_SWITCH_EVERY_TIME or DOING_NO_SWITCH")
        if name == "pai_forward_function":
            activation_name(self._values[name])

        if kind == "config":
            self.to_config()
        if kind == "run" and name == "save_name" and not isinstance(self._values[name], str):
            raise ConfigError("save_name must be a string (the run folder)")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        if attr in SETTINGS:  # GPA.pc.max_dendrites, as PerforatedAI's PAIConfig has
            return self.get(attr)
        for prefix in _PREFIXES:
            if attr.startswith(prefix):
                name = attr[len(prefix):]
                self._known(name)
                if prefix == "get_":
                    return lambda: self.get(name)
                if prefix == "set_":
                    return lambda value: self.set(name, value)
                return lambda values: self.append(name, values)
        raise CompatNameError(
            f"GPA.pc has no attribute {attr!r}: settings are read and written with "
            f"GPA.pc.get_<name>() and GPA.pc.set_<name>(value)"
            f"{_suggest(attr, [p + n for n in SETTINGS for p in _PREFIXES])}")

    def __setattr__(self, attr: str, value: Any) -> None:
        """``GPA.pc.max_dendrites = 3`` is ``GPA.pc.set_max_dendrites(3)``; other public
        names are errors (an assignment perfora would never read)."""
        if attr.startswith("_"):
            object.__setattr__(self, attr, value)
        elif attr in SETTINGS:
            self.set(attr, value)
        else:
            raise UnknownSettingError(unknown_setting_message(attr))

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__())
                      | {p + n for n in SETTINGS for p in _PREFIXES})

    # ------------------------------------------------------------ translation
    def to_config(self, doing_pai: bool = True) -> PerforaConfig:
        """The perfora settings these values stand for (``doing_pai=False``: the baseline)."""
        v = self._values
        mode = v["switch_mode"]
        max_dendrites = v["max_dendrites"] if doing_pai else 0
        thr = v["improvement_threshold"]
        settings: dict[str, Any] = {
            "maximize": v["maximizing_score"],
            "switch_mode": SWITCH_MODES.get(mode, "patience"),
            "n_epochs_to_switch": v["n_epochs_to_switch"],
            "improvement_threshold": tuple(thr) if isinstance(thr, list) else thr,
            "improvement_threshold_raw": v["improvement_threshold_raw"],
            "history_lookback": v["history_lookback"],
            "fixed_switch_num": v["fixed_switch_num"],
            "max_dendrites": max_dendrites,
            "max_dendrite_tries": v["max_dendrite_tries"],
            "retain_all_dendrites": v["retain_all_dendrites"],
            # the baseline (no dendrites) is plain early stopping, capacity test or not
            "capacity_test": bool(v["testing_dendrite_capacity"]) and max_dendrites != 0,
            "activation": activation_name(v["pai_forward_function"]),
            "rule": "correlation" if v["perforated_backpropagation"] else "gd",
            # PerforatedAI's growth, whatever perfora's defaults are: every neuron gets a
            # dendrite with random weights, and the optimizer starts afresh after it
            "dendrite_init": "default",
            "grow_fraction": 1.0,
            "growth": "dendrites",
            "dendrite_optimizer": "restart",
            "checkpoint_time_budget": v["checkpoint_time_budget"],
        }
        if mode == DOING_NO_SWITCH:
            settings["n_epochs_to_switch"] = NEVER_COMPLETES
        if "candidate_weight_initialization_multiplier" in self._explicit:
            settings["dendrite_init"] = "normal"
            settings["dendrite_init_scale"] = v["candidate_weight_initialization_multiplier"]
        return PerforaConfig(**settings)

    # ---------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        """Every setting as JSON-able values (classes and functions by qualified name)."""
        return {name: _jsonable(value) for name, value in self._values.items()}

    def explicit_dict(self) -> dict[str, Any]:
        """Only the settings the script set itself, JSON-able."""
        return {name: _jsonable(self._values[name]) for name in sorted(self._explicit)}


def unknown_setting_message(name: str) -> str:
    """'GPA.pc has no setting X; did you mean Y?'."""
    suggestion = _suggest(name, list(SETTINGS))
    return (f"GPA.pc has no setting {name!r}{suggestion}{' ' if suggestion else '. '}Known "
            "settings: see perfora.compat.settings.SETTINGS")


def _suggest(name: str, known: list[str]) -> str:
    close = nearest_name(name, known)
    return f"; did you mean {close!r}?" if close else ""


def _jsonable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if callable(value) or isinstance(value, torch.dtype):
        name = _ACTIVATIONS.get(value) if not isinstance(value, torch.dtype) else None
        return name or str(getattr(value, "__name__", value))
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)
