"""``GPA.pai_tracker``: PerforatedAI's tracker calls, mapped onto one GrowthController.

The tracker holds no decision logic: scores go to :meth:`GrowthController.step`, the
optimizer recipe to :meth:`GrowthController.set_optimizer`, checkpoints are the
controller's, written under PerforatedAI's file names (``switch_N.pt``, ``best_model.pt``,
``latest.pt``; safetensors content).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._version import __version__
from ..checkpoint.dcp import DCP_SUFFIX
from ..checkpoint.files import atomic_write_text
from ..config import PerforaConfig, nearest_name
from ..distributed.collectives import is_rank_zero
from ..errors import CompatNameError, ConfigError, OrderError
from ..growth import GrowthController
from ..growth.restart import COMPLETE_MARKER
from ..nn.layers import dendritic_layers, unwrap_model
from ..warn import warn_user
from .messages import compat_terms
from .rewrap import refuse_fsdp2, rewrap
from .settings import PAISettings

log = logging.getLogger("perfora")

SETTINGS_FILE = "pai_tracker_settings.json"

_MISSING_HINTS = {
    "member_vars": "the controller's state is GPA.pai_tracker.controller.state",
    "start_epoch": "perfora times every epoch itself (the 'seconds' column of metrics.csv)",
    "stop_epoch": "perfora times every epoch itself (the 'seconds' column of metrics.csv)",
    "save_graphs": "perfora draws history.png at restructures and at the end; "
                   "GPA.pai_tracker.controller.finish() draws it now",
    "set_dendrite_training": "perfora's gradient-descent dendrites train with the neurons",
    "set_neuron_training": "perfora's gradient-descent dendrites train with the neurons",
    "add_loss": "report it with GPA.pai_tracker.add_extra_score(loss, 'loss')",
    "add_learning_rate": "perfora records the learning rate of every epoch in metrics.csv",
}


class CompatController(GrowthController):
    """A GrowthController whose checkpoints carry PerforatedAI's file names."""

    warns_unrestored_optimizer = False  # the recipe loads before setup_optimizer
    adopts_saved_direction = True  # load_system restores the tracker, its direction too
    resume_hint = "model = UPA.load_system(model, save_name, 'latest', True)"

    def checkpoint_path(self, name: str) -> Path:
        """``best`` -> best_model.pt; ``latest``/``switch_N`` -> <name>.pt in the run folder
        (DCP folders keep perfora's names)."""
        path = super().checkpoint_path(name)
        if path.suffix == DCP_SUFFIX:
            return path
        return path.with_name(f"{'best_model' if name == 'best' else name}.pt")


class PAITracker:
    """The object ``GPA.pai_tracker``; :func:`UPA.perforate_model` attaches it to a model."""

    def __init__(self, settings: PAISettings) -> None:
        self._pc = settings
        self.reset()

    def reset(self) -> None:
        """Forget the model, the controller and the registered optimizer classes."""
        self.controller: CompatController | None = None
        self.save_dir: Path | None = None
        self._doing_pai = True
        self._config: PerforaConfig | None = None
        self._optimizer_cls: type | None = None
        self._scheduler_cls: type | None = None
        self._test_score: Any = None
        self._extras: dict[str, Any] = {}

    # ----------------------------------------------------------------- set up
    def attach(self, model: nn.Module, save_dir: str | Path, doing_pai: bool = True) -> None:
        """Start a run on ``model`` (already perforated): a new controller, files in save_dir."""
        self.reset()
        self._doing_pai = doing_pai
        self.save_dir = Path(save_dir)
        self._config = self._pc.to_config(doing_pai)
        if is_rank_zero():
            # a marker left by an earlier run would make a restart launcher stop at once
            (self.save_dir / COMPLETE_MARKER).unlink(missing_ok=True)
        self.controller = CompatController(model, self._config, run_dir=self.save_dir)

    def _ctl(self, call: str) -> CompatController:
        if self.controller is None:
            raise OrderError(f"GPA.pai_tracker.{call} before UPA.perforate_model(model): "
                             "convert the model first, e.g. model = UPA.perforate_model(model, "
                             "save_name='PAI', maximizing_score=True)")
        return self.controller

    def _sync_config(self) -> None:
        """Settings changed on GPA.pc after perforate_model apply from the next epoch on."""
        ctl = self._ctl("add_validation_score")
        config = self._pc.to_config(self._doing_pai)
        if config != self._config:
            self._config = ctl.config = config

    # -------------------------------------------------------------- optimizer
    def set_optimizer(self, optimizer_class: type) -> None:
        """Register the optimizer class (e.g. torch.optim.Adam); arguments come later."""
        if isinstance(optimizer_class, torch.optim.Optimizer):
            raise ConfigError("GPA.pai_tracker.set_optimizer takes the optimizer class (e.g. "
                              "torch.optim.Adam; its arguments go to setup_optimizer), not an "
                              "optimizer you built: register that one with "
                              "GPA.pai_tracker.set_optimizer_instance(optimizer)")
        if not (isinstance(optimizer_class, type)
                and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise ConfigError(f"GPA.pai_tracker.set_optimizer needs an optimizer class such as "
                              f"torch.optim.Adam, got {optimizer_class!r}")
        self._optimizer_cls = optimizer_class

    def set_scheduler(self, scheduler_class: type | None) -> None:
        """Register the LR scheduler class (stepped by perfora once per epoch)."""
        if scheduler_class is not None and not isinstance(scheduler_class, type):
            raise ConfigError(f"GPA.pai_tracker.set_scheduler needs a scheduler class such as "
                              f"torch.optim.lr_scheduler.StepLR, got {scheduler_class!r}")
        self._scheduler_cls = scheduler_class

    def setup_optimizer(self, net: nn.Module, opt_args: dict[str, Any],
                        sched_args: dict[str, Any] | None = None,
                        parameters: Any = None) -> tuple[torch.optim.Optimizer, Any]:
        """Build (optimizer, scheduler) with the registered classes and these arguments.

        ``opt_args['params']`` is ignored: perfora builds the optimizer over the model's
        trainable parameters, and rebuilds it the same way after every restructure.
        """
        ctl = self._ctl("setup_optimizer")
        self._check_model(net, "setup_optimizer")
        if self._optimizer_cls is None:
            raise OrderError("GPA.pai_tracker.setup_optimizer before set_optimizer: call "
                             "GPA.pai_tracker.set_optimizer(torch.optim.Adam) (your optimizer "
                             "class) first")
        kwargs = dict(opt_args or {})
        params = kwargs.pop("params", parameters)
        if params is not None and not isinstance(params, nn.Module):
            params = list(params)
            if params and isinstance(params[0], dict):
                raise ConfigError("setup_optimizer got parameter groups (dicts) in "
                                  "optimArgs['params']; perfora rebuilds the optimizer over all "
                                  "trainable parameters after each restructure. Pass "
                                  "model.parameters(), or build the optimizer yourself and use "
                                  "GPA.pai_tracker.set_optimizer_instance(optimizer)")
        ctl.set_optimizer(self._optimizer_cls, **kwargs)
        if sched_args and self._scheduler_cls is None:
            warn_user("GPA.pai_tracker.setup_optimizer got schedArgs but no scheduler class is "
                      "registered, so no scheduler is built: call "
                      "GPA.pai_tracker.set_scheduler(torch.optim.lr_scheduler.StepLR) (yours) "
                      "before setup_optimizer")
        if self._scheduler_cls is not None:
            ctl.set_scheduler(self._scheduler_cls, **dict(sched_args or {}))
        return ctl.build_optimizer()

    def set_optimizer_instance(self, optimizer: torch.optim.Optimizer,
                               additional_optimizers: list | None = None) -> None:
        """Use an optimizer built by the script; rebuild and register it after restructures."""
        if additional_optimizers:
            raise ConfigError("set_optimizer_instance(additional_optimizers=...) is not "
                              "supported: perfora steps one optimizer's scheduler; keep the "
                              "others in your script and rebuild them when restructured")
        self._ctl("set_optimizer_instance").set_optimizer_instance(optimizer)
        optimizer.zero_grad()

    # ------------------------------------------------------------------ scores
    def add_test_score(self, score: Any, name: str = "test") -> None:
        """The test score of this epoch (kept for the best-per-architecture table)."""
        self._test_score = score

    def add_extra_score(self, score: Any, name: str) -> None:
        """A named score for metrics.csv and history.png (recorded with the next epoch)."""
        self._extras[str(name)] = score

    def add_extra_score_without_graphing(self, score: Any, name: str) -> None:
        """A named score for metrics.csv (recorded with the next epoch)."""
        self._extras[str(name)] = score

    def add_validation_score(self, score: Any, net: nn.Module, force_switch: bool = False
                             ) -> tuple[nn.Module, bool, bool]:
        """One epoch: returns (model, restructured, training_complete).

        The model is what was given: the same module (grown in place) or, for a
        DataParallel/DDP wrapper, a new wrapper of the same kind around it after a change.
        After ``restructured`` call setup_optimizer again; on ``training_complete`` the
        model holds the best weights and ``<save_name>/.training_complete`` exists.
        """
        ctl = self._ctl("add_validation_score")
        self._check_model(net, "add_validation_score")
        self._sync_config()
        test, extras = self._test_score, self._extras
        self._test_score, self._extras = None, {}
        with compat_terms():
            decision = ctl.step(score, test_score=test, extra=extras, model=net)
            if force_switch and decision.action == "continue":
                decision = ctl.add_dendrites()
        changed = decision.restructured or decision.complete
        if decision.complete:
            self._mark_complete()
            log.info("perfora: training complete (%s)", decision.reason)
        elif changed and not self._pc.get("silent"):
            log.info("perfora: %s", decision.reason)
        return self._same_kind(net, decision.model, changed), changed, decision.complete

    @staticmethod
    def _same_kind(net: nn.Module, decided: nn.Module, changed: bool) -> nn.Module:
        """What the caller gave, after a change: the module itself, or a fresh wrapper."""
        if not changed:
            return net
        if type(decided) is type(net) and unwrap_model(decided) is unwrap_model(net):
            return decided  # the bare module, or the controller's own new wrapper
        return rewrap(net)

    def _mark_complete(self) -> None:
        if self.save_dir is not None and is_rank_zero():
            atomic_write_text(self.save_dir / COMPLETE_MARKER,
                              json.dumps({"epoch": self._ctl("").epoch,
                                          "dendrites": self._ctl("").num_dendrites}) + "\n")

    def _check_model(self, net: nn.Module, call: str) -> None:
        ctl = self._ctl(call)
        if not isinstance(net, nn.Module):
            raise OrderError(f"GPA.pai_tracker.{call} needs the model, got "
                             f"{type(net).__name__}")
        refuse_fsdp2(net, call)
        if unwrap_model(net) is not unwrap_model(ctl.model):
            raise OrderError(f"GPA.pai_tracker.{call} got a different model from the one given "
                             "to UPA.perforate_model; pass that model (or its DataParallel/DDP "
                             "wrapper)")

    # ------------------------------------------------------ multi-GPU settings
    def settings_path(self) -> Path:
        """``<save_name>/pai_tracker_settings.json``."""
        self._ctl("settings_path")
        assert self.save_dir is not None
        return self.save_dir / SETTINGS_FILE

    def save_tracker_settings(self) -> Path:
        """Write the settings and wrapped layers (rank 0). perfora sizes everything eagerly,
        so the PerforatedAI recipe's initialization run is optional; this file records what it
        saw."""
        ctl = self._ctl("save_tracker_settings")
        path = self.settings_path()
        if is_rank_zero():
            layers = {p: {"neurons": layer.num_neurons, "dendrites": layer.num_dendrites}
                      for p, layer in dendritic_layers(ctl.model).items()}
            atomic_write_text(path, json.dumps(
                {"perfora_version": __version__, "settings": self._pc.to_dict(),
                 "explicit": sorted(self._pc.explicit_dict()), "layers": layers},
                indent=1) + "\n")
        return path

    def initialize_tracker_settings(self) -> dict[str, Any] | None:
        """Read the file save_tracker_settings wrote, if any; warn about differences.

        Nothing needs it (perfora sizes everything eagerly), so a missing file is fine.
        Returns the saved content, or None without a file.
        """
        ctl = self._ctl("initialize_tracker_settings")
        path = self.settings_path()
        if not path.is_file():
            log.info("perfora: no %s (the initialization run is optional with perfora)", path)
            return None
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            warnings.warn(f"{path} is unreadable ({exc}); it is not needed, delete it or "
                          "rerun the initialization run", stacklevel=2)
            return None
        now_layers = {p: layer.num_neurons for p, layer in dendritic_layers(ctl.model).items()}
        then_layers = {p: v.get("neurons") for p, v in saved.get("layers", {}).items()}
        if now_layers != then_layers:
            warnings.warn(f"{path} was written for other wrapped layers ({sorted(then_layers)}"
                          f" vs {sorted(now_layers)} now); perfora does not need it, but rerun "
                          "the --perforate_model_parallel run to keep it current", stacklevel=2)
        now = self._pc.to_dict()
        changed = sorted(k for k, v in saved.get("settings", {}).items() if now.get(k) != v)
        if changed:
            warnings.warn(f"settings changed since {path} was written: {changed}; the current "
                          "values are used", stacklevel=2)
        return saved

    # ------------------------------------------------------------------- misc
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        hint = _MISSING_HINTS.get(attr)
        known = [n for n in dir(type(self)) if not n.startswith("_")]
        close = nearest_name(attr, known, cutoff=0.6)
        raise CompatNameError(
            f"GPA.pai_tracker has no {attr!r}: perfora's PerforatedAI shell does not provide it"
            + (f" ({hint})" if hint else "")
            + (f"; did you mean {close!r}?" if close and not hint else ""))
