"""What the Lightning and Hugging Face growth callbacks share, whatever the framework.

:class:`GrowthCallback` is mixed in before the framework's own callback base: it finds the
submodule that grows, perforates it once, hands each monitored score to the controller and
keeps the last decision. The functions read a monitored metric, and write and read the
controller's state in a framework checkpoint (structure, scores, rule state, best
snapshot; the framework saves the weights itself).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from ..checkpoint.format import Checkpoint, save_checkpoint
from ..checkpoint.model_state import shadow_copy
from ..config import PerforaConfig, nearest_name
from ..errors import CheckpointError, ConfigError
from ..growth import Decision, GrowthController
from ..growth.rehearsal import framework_state
from ..growth.saved_run import load_checkpoint
from ..nn.layers import dendritic_layers
from ..nn.perforation import fit_structure, layer_specs, perforate

MODES = ("min", "max")
"""The directions a monitored metric can improve in: ``"min"`` (a loss), ``"max"``."""
CALLBACK_DEFAULTS = {"n_epochs_to_switch": 10, "max_dendrites": 3}
"""A growth callback's patience and dendrite cap where neither the call nor config= sets them."""
CONTROLLER_FILE = "perfora.safetensors"
"""The file perfora adds to a framework's checkpoint folder: the controller's state."""
PHASE_CODES = {"neuron": 0, "dendrite": 1}
"""Numeric codes of the learning rule's phases, as logged in ``perfora/phase``."""


class GrowthCallback:
    """The framework-independent half of a growth callback.

    A subclass sets ``callback_name`` and ``model_noun`` (for error messages), calls
    :meth:`_init_growth` from its ``__init__`` and :meth:`_step` with each monitored score;
    everything about the framework's trainer, wrappers and optimizers stays in the subclass.
    """

    callback_name: ClassVar[str] = "GrowthCallback"
    model_noun: ClassVar[str] = "model"

    module_path: str | None
    perforate_kwargs: dict[str, Any]
    controller: GrowthController | None
    last_decision: Decision | None

    def _init_growth(self, *, patience: int | None, max_dendrites: int | None,
                     module: str | None, config: PerforaConfig | Mapping[str, Any] | None,
                     perforate_kwargs: Mapping[str, Any] | None,
                     settings: Mapping[str, Any]) -> None:
        """Keep what every growth callback is given; the controller comes later.

        ``patience`` and ``max_dendrites`` left out take the value set in ``config`` (a
        setting given there is never silently replaced), else the callback's defaults; given
        both ways with different values, a ConfigError."""
        for setting, own in (("n_epochs_to_switch", "patience"), ("maximize", "mode")):
            if setting in settings:  # one would silently win over the other
                raise ConfigError(f"{self.callback_name}({setting}=...): this callback takes "
                                  f"{own}= for it (as EarlyStopping does); give {own}= only")
        if module is not None and not isinstance(module, str):
            raise ConfigError(f"{self.callback_name}(module=...) takes the attribute path of "
                              "the submodule to grow, as a string (module=\"net\" for "
                              f"self.net), not the {type(module).__name__} itself")
        self.module_path = module
        self.perforate_kwargs = dict(perforate_kwargs or {})
        self._base_config = PerforaConfig.coerce(config) if config is not None else \
            PerforaConfig(save_checkpoints=False)
        self._set_in_config = set_in(config)
        self._overrides: dict[str, Any] = {}
        for setting, own, given in (("n_epochs_to_switch", "patience", patience),
                                    ("max_dendrites", "max_dendrites", max_dendrites)):
            chosen = self._agree(setting, own, given, getattr(self._base_config, setting))
            if chosen is None and setting not in self._set_in_config:
                chosen = CALLBACK_DEFAULTS[setting]
            if chosen is not None:
                self._overrides[setting] = chosen
        self._overrides.update(settings)
        self.controller = None
        self.last_decision = None

    def _agree(self, setting: str, own: str, given: Any, in_config: Any,
               shown: Any = None) -> Any:
        """``given`` (None: not given); a ConfigError where ``config`` set another value
        (``shown``: the argument as the user wrote it, where ``given`` is translated)."""
        if given is not None and setting in self._set_in_config and given != in_config:
            shown = given if shown is None else shown
            raise ConfigError(f"{self.callback_name}({own}={shown!r}) and config="
                              f"{{{setting!r}: {in_config!r}}} disagree; give one of them")
        return given

    def config_mode(self, mode: str | None) -> str | None:
        """``mode``, else the direction ``config`` set with ``maximize``, else None (the
        callback's own default applies)."""
        maximize = self._base_config.maximize
        given = None if mode is None else mode == "max"
        if self._agree("maximize", "mode", given, maximize, shown=mode) is not None:
            return mode
        if "maximize" in self._set_in_config:
            return "max" if maximize else "min"
        return None

    def growth_config(self, mode: str) -> PerforaConfig:
        """The controller's config: the base config with ``mode`` and the given settings
        (invalid settings raise a ConfigError)."""
        return self._base_config.replace(**{"maximize": mode == "max", **self._overrides})

    def target(self, model: nn.Module) -> nn.Module:
        """The module that gets dendrites: ``model`` itself or its ``module`` attribute path."""
        if self.module_path is None:
            return model
        try:
            return model.get_submodule(self.module_path)
        except AttributeError as exc:
            names = [n for n, _ in model.named_children()]
            raise ConfigError(f"{self.callback_name}(module={self.module_path!r}): the "
                              f"{self.model_noun} has no such submodule; its children are "
                              f"{names}") from exc

    def _perforate_target(self, model: nn.Module, config: PerforaConfig) -> nn.Module:
        """Perforate the target of ``model`` unless it already has dendritic layers."""
        target = self.target(model)
        chosen = {"activation": config.activation} if config.activation else {}
        perforate_once(target, {**chosen, **self.perforate_kwargs})
        return target

    def _step(self, score: float, model: nn.Module,
              optimizer: torch.optim.Optimizer | None) -> Decision:
        """One score to the controller; ``optimizer`` is only read (its learning rate goes
        to metrics.csv and history.png)."""
        assert self.controller is not None
        self.controller.hand_over_optimizer(optimizer)
        decision = self.controller.step(score, model=self.target(model))
        self.last_decision = decision
        return decision

    def growth_metrics(self, decision: Decision) -> dict[str, float]:
        """What a framework's loggers get after each step: the model's dendrite sets and
        neuron steps, the rule's phase (``PHASE_CODES``) and the parameter count."""
        assert self.controller is not None
        return {"perfora/dendrites": float(decision.num_dendrites),
                "perfora/neuron_steps": float(self.controller.state.num_widenings),
                "perfora/phase": float(PHASE_CODES.get(decision.phase, -1)),
                "perfora/params": float(self.controller.parameter_count())}

    def _finish(self) -> None:
        """Write the run's last files (the fit or training ended)."""
        if self.controller is not None:
            self.controller.finish()


def set_in(config: PerforaConfig | Mapping[str, Any] | None) -> set[str]:
    """The settings ``config`` sets: a mapping's keys, or the settings a PerforaConfig was
    given by name (even where they equal its defaults: ``PerforaConfig(maximize=True)``
    sets the direction)."""
    if config is None:
        return set()
    if isinstance(config, Mapping):
        return set(config)
    return set(PerforaConfig.coerce(config).explicit_settings)


def check_mode(mode: str) -> None:
    """Refuse a direction other than ``"min"`` and ``"max"``."""
    if mode not in MODES:
        raise ConfigError(f"mode must be 'min' or 'max', got {mode!r}")


def perforate_once(target: nn.Module, perforate_kwargs: Mapping[str, Any]) -> nn.Module:
    """Perforate ``target`` unless it already has dendritic layers (a resumed or prepared
    model keeps its own)."""
    if not dendritic_layers(target):
        perforate(target, **perforate_kwargs)
    return target


def read_score(metrics: Mapping[str, Any], *names: str) -> float | None:
    """The first of ``names`` found in ``metrics``, as a float (a tensor's value); None
    when none of them was reported."""
    for name in names:
        if name in metrics:
            value = metrics[name]
            return float(value.item() if isinstance(value, torch.Tensor) else value)
    return None


def did_you_mean(monitor: str, names: Mapping[str, Any]) -> str:
    """`` (did you mean 'x'?)`` for the reported name closest to ``monitor``, else ``""``."""
    close = nearest_name(monitor, list(names))
    return f" (did you mean {close!r}?)" if close else ""


def controller_state(ctl: GrowthController
                     ) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """The controller's state for a framework checkpoint: ``(meta, best)``.

    ``meta`` holds the model's dendrite structure, the controller and rule state and the
    best snapshot's structure; ``best`` the best snapshot's tensors on the CPU (None when
    there is none yet). No weights: the framework saves those."""
    meta: dict[str, Any] = {**ctl.state_dict(), "structure": layer_specs(ctl.model)}
    best: dict[str, torch.Tensor] | None = None
    snapshot = ctl.best_snapshot
    if snapshot is not None:
        meta["best_structure"] = snapshot[0]
        best = {k: v.detach().cpu().contiguous() for k, v in snapshot[1].items()}
    return meta, best


def dendrite_counts(specs: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """The dendrite count of every layer in a structure (``layer_specs``)."""
    return {path: int(spec.get("num_dendrites", 0)) for path, spec in specs.items()}


def save_controller_file(ctl: GrowthController, path: str | os.PathLike) -> None:
    """Write :func:`controller_state` to one safetensors file (JSON metadata, no pickle)."""
    meta, best = controller_state(ctl)
    tensors = {"best": best} if best is not None else {}
    save_checkpoint(path, Checkpoint(tensors=tensors, meta=json.loads(json.dumps(meta))))


def read_controller_file(path: str | os.PathLike) -> Checkpoint:
    """The checked content of a file :func:`save_controller_file` wrote (nothing changes)."""
    ckpt = load_checkpoint(path)
    if not isinstance(ckpt.meta.get("structure"), dict):
        raise CheckpointError(f"{path}: structure: missing")
    return ckpt


def apply_controller_file(ctl: GrowthController, ckpt: Checkpoint) -> None:
    """Give the model the dendrites of a :func:`read_controller_file` and restore the
    controller from it (before the framework loads the weights into the grown model).

    Rehearsed first on a weightless copy with the saved structure (the controller and rule
    state, the best snapshot): a file that does not fit changes nothing."""
    shadow = shadow_copy(ctl.model)
    if shadow is not None:
        fit_structure(shadow, ckpt.meta["structure"], "the controller file", CheckpointError)
        framework_state(ckpt.meta, ckpt.tensors.get("best"), shadow, ctl.backend, ctl.config)
    ctl.match_structure(ckpt.meta["structure"])
    ctl.load_state(ckpt.meta, ckpt.tensors.get("best"))


def load_controller_file(ctl: GrowthController, path: str | os.PathLike) -> None:
    """:func:`read_controller_file`, then :func:`apply_controller_file`."""
    apply_controller_file(ctl, read_controller_file(path))


def check_structure_fits_weights(model: nn.Module, module: str | None,
                                 specs: Mapping[str, Mapping[str, Any]],
                                 shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
    """CheckpointError unless the saved weights ``shapes`` (the whole model's state-dict keys
    and shapes) hold exactly the dendrite tensors that ``specs`` gives the dendritic layers
    of the ``module`` submodule of ``model``: rehearsed on a weightless copy, so ``model``
    never changes."""
    shadow = shadow_copy(model)
    if shadow is None:  # a model that cannot be copied: the framework's own load checks
        return
    target = shadow.get_submodule(module) if module else shadow
    fit_structure(target, specs, source, CheckpointError)
    own = shadow.state_dict()
    for path in dendritic_layers(target):
        prefix = ".".join(p for p in (module, path) if p)
        prefix = f"{prefix}." if prefix else ""
        mine = {k: tuple(v.shape) for k, v in own.items() if _grown_key(k, prefix)}
        theirs = {k: tuple(v) for k, v in shapes.items() if _grown_key(k, prefix)}
        if mine == theirs:
            continue
        key = sorted(set(mine) ^ set(theirs) or
                     {k for k in mine if mine[k] != theirs[k]})[0]
        raise CheckpointError(
            f"{source}: the controller file and the model weights are from different points "
            f"of the run: for {key!r} the controller file's dendrite structure gives "
            f"{_shape_or_none(mine.get(key))} but the weights hold "
            f"{_shape_or_none(theirs.get(key))}. Resume from a checkpoint folder as it was "
            "written (both files from the same save); nothing was changed")


def _grown_key(key: str, prefix: str) -> bool:
    """True for a dendrite tensor of the layer at ``prefix`` (its base layer's own weights
    left out: a framework may save a tied base weight under another name only)."""
    return key.startswith(prefix) and not key[len(prefix):].startswith("base.")


def _shape_or_none(shape: tuple[int, ...] | None) -> str:
    return "no such tensor" if shape is None else f"shape {shape}"
