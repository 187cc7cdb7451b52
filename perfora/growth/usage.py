"""Warnings about training mistakes perfora can see but not fix.

Three mistakes leave a run training on without its dendrites, silently (and a fourth, a loss
reported as a score to maximize, keeps the first epoch's model as the best):

* a wrapped layer is never called, because its parent reads its ``weight`` directly (a
  fused attention kernel does) or the layer is unused: dendrites there cannot act;
* ``step()`` is called with no optimizer registered, so nothing rebuilds it after growth;
* the optimizer in use after a restructure is the old one: the new dendrites (or the widened
  layers' weights) never change.

:class:`UsageWatch` checks each of them once, cheaply, and warns with the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet

import torch
from torch import nn

from ..distributed.collectives import world_size
from ..distributed.replica_check import drifted_parameters
from ..nn.layers import DendriticLayer, dendritic_layers, unwrap_model
from ..parallel.base import ParallelBackend
from ..warn import warn_user
from .state import ControllerState

DIRECTION_EPOCHS = 4  # reports that all move the wrong way before the direction is questioned
_SAMPLE = 1024  # elements compared per parameter: enough to see any optimizer step
_DENDRITE_GROUPS = ("bank", "cascade", "out", "candidate")


class UsageWatch:
    """Checks, once each, that wrapped layers run and that new dendrites get trained.

    Layers are watched during the first epoch and the epoch after each restructure: each
    layer's forward records that it ran (:meth:`DendriticLayer.forget_calls`), with no hook,
    so watching adds no recompile under ``torch.compile``; :meth:`end_epoch` checks. Nothing
    is checked in an epoch in which the model did not train.
    """

    def __init__(self) -> None:
        self._watched: dict[str, DendriticLayer] = {}
        self._fresh: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self._warned: set[str] = set()

    # -------------------------------------------------------------- calls
    def watch_calls(self, layers: Mapping[str, DendriticLayer]) -> None:
        """Start recording which wrapped layers run (until :meth:`end_epoch`)."""
        self._watched = dict(layers)
        for layer in self._watched.values():
            layer.forget_calls()

    def stop_watching_calls(self) -> None:
        """Stop watching (the layers keep recording, which costs nothing to read)."""
        self._watched = {}

    def end_epoch(self, has_optimizer: bool, awaiting_instance: bool = False) -> None:
        """Check the epoch just reported (if it was watched), then stop watching.

        ``awaiting_instance``: a restructure dropped the optimizer the user registered with
        ``set_optimizer_instance`` and no new one has been registered since."""
        layers = self._watched
        trained = any(layer.seen_training_call for layer in layers.values())
        idle = sorted(p for p, layer in layers.items() if not layer.seen_call)
        self.stop_watching_calls()
        if trained:
            self._check_calls(idle)
            if awaiting_instance:  # one warning for this mistake, not two
                self._check_instance_renewed()
            else:
                self._check_optimizer_registered(has_optimizer)
                self._check_new_dendrites_trained()
        self._fresh = []

    def _check_calls(self, idle: list[str]) -> None:
        """Warn about wrapped layers that never ran while others did."""
        if idle:
            self._warn("idle", f"wrapped layer(s) {idle[:5]} never ran during the last epoch "
                       "while the rest of the model did. Their parent module probably reads "
                       "their weight directly (a fused kernel) or does not use them, so "
                       "dendrites added there have no effect. Exclude them: "
                       f"perforate(model, exclude={idle[:5]})")

    # -------------------------------------------------------------- optimizer
    def _check_optimizer_registered(self, has_optimizer: bool) -> None:
        """Warn once when steps are reported with no optimizer for perfora to rebuild."""
        if not has_optimizer:
            self._warn("no-optimizer", "step() with no optimizer registered: perfora will "
                       "add dendrites, but cannot give you an optimizer that trains them. "
                       "Register yours first: controller.set_optimizer(torch.optim.Adam, "
                       "lr=...) (perfora rebuilds it), or set_optimizer_instance(opt)")

    def _check_instance_renewed(self) -> None:
        """Warn once when an epoch trained after a restructure dropped the user's optimizer."""
        self._warn("instance-not-renewed", "perfora cannot rebuild an optimizer it did not "
                   "build: the one given to set_optimizer_instance was dropped at the last "
                   "restructure, and this epoch trained without a new one, so the new "
                   "dendrites were not trained. After every decision with restructured=True, "
                   "create a new optimizer over model.parameters() and pass it to "
                   "set_optimizer_instance again (or use set_optimizer(cls, **kwargs) and let "
                   "perfora rebuild it)")

    def after_restructure(self, layers: Mapping[str, DendriticLayer],
                          kept: AbstractSet[int] | None = None) -> None:
        """Sample the trainable dendrite parameters now and watch the next epoch. ``kept``:
        after a neuron step, the ids of the parameters from before it; every wrapped layer's
        parameter not among them (a widened weight is a new tensor) is sampled instead."""
        self.watch_calls(layers)
        self._fresh = []
        for path, layer in layers.items():
            params = [p for p in layer.parameters() if id(p) not in kept] if kept is not None \
                else [p for group in _DENDRITE_GROUPS for p in layer.group_parameters(group)]
            for p in params:
                if p.requires_grad and type(p.data) is torch.Tensor:
                    sample = p.detach().reshape(-1)[:_SAMPLE]
                    self._fresh.append((path, p, sample.clone()))

    def _check_new_dendrites_trained(self) -> None:
        """Warn when not one sampled dendrite parameter changed since the restructure."""
        fresh = self._fresh
        if not fresh:
            return
        unchanged = all(torch.equal(p.detach().reshape(-1)[:_SAMPLE], before)
                        for _, p, before in fresh)
        if unchanged:
            self._warn("stale-optimizer", "the dendrites added (or the layers widened) at "
                       "the last restructure did not change during the epoch since: the "
                       "optimizer that trained the model does not hold them. After every "
                       "decision with restructured=True, train with decision.optimizer (and "
                       "decision.model); with set_optimizer_instance, build a new optimizer "
                       "over model.parameters() and register it again")

    # -------------------------------------------------------------- at each report
    def check_report(self, model: nn.Module, backend: ParallelBackend, state: ControllerState,
                     score: float, maximize: bool) -> None:
        """Before a report is taken: the model holds what the controller grew, replicated
        ranks are still alike (a collective under torch.distributed), and, at the 4th
        report, the scores' direction."""
        self.check_structure(model, state)
        if world_size() > 1 and not (backend.sharded or backend.owns_optimizer):
            self.check_replicas(drifted_parameters(model))
        history = state.history
        if len(history) + 1 == DIRECTION_EPOCHS:
            self.check_direction([*(row["val_score"] for row in history), score], maximize)

    def check_structure(self, model: nn.Module, state: ControllerState) -> None:
        """Warn once when the model's dendrite sets or neuron steps differ from the
        controller's: a ``load_state_dict`` of another point of the run resized the layers
        without the controller (its optimizer then misses their parameters)."""
        held = [(layer.num_dendrites, len(getattr(layer, "widenings", None) or []))
                for layer in dendritic_layers(unwrap_model(model)).values()]
        sets = max((d for d, _ in held), default=0)
        steps = max((w for _, w in held), default=0)
        if (sets, steps) != (state.num_dendrites, state.num_widenings):
            self._warn("structure", f"the model holds {sets} dendrite set(s) and {steps} "
                       f"neuron step(s), but the controller grew {state.num_dendrites} and "
                       f"{state.num_widenings}: the model was changed outside the controller "
                       "(a model.load_state_dict of another point of the run?). Go back with "
                       "the controller instead, which restores the optimizer with the model: "
                       "controller.load('best' or 'switch_N') or perfora.resume")

    def check_replicas(self, drifted: list[str]) -> None:
        """Warn once when replicated ranks hold different weights after an epoch."""
        if drifted:
            names = ", ".join(drifted[:3])
            self._warn("replicas", f"the ranks' weights differ after this epoch ({names}): "
                       "the replicas trained apart. The model trained is "
                       "probably a wrapper made for the parameters before a growth step: the "
                       "old DDP wrapper (train with decision.model after every "
                       "decision.restructured; the controller built a new one), or one the "
                       "controller does not know: pass it at every report, "
                       "controller.step(score, model=ddp_model) (the controller then rebuilds "
                       "it after each growth), or wrap the model again after every "
                       "decision.restructured (Accelerate: prepare_after_growth, Fabric: "
                       "setup_after_growth)")

    # -------------------------------------------------------------- the score's direction
    def check_direction(self, scores: list[float], maximize: bool) -> None:
        """Warn once when the first reports all move the way the setting calls worse (a loss
        reported with the default ``maximize=True``): the best model stays the first one."""
        if len(scores) < DIRECTION_EPOCHS:
            return
        first = scores[:DIRECTION_EPOCHS]
        pairs = list(zip(first, first[1:], strict=False))
        worse = all(b < a for a, b in pairs) if maximize else all(b > a for a, b in pairs)
        if worse:
            kind, fix = ("fell", "it is a loss (lower is better), set maximize=False") \
                if maximize else ("rose", "higher is better, set maximize=True")
            self._warn("direction", f"the scores {kind} at each of the first "
                       f"{DIRECTION_EPOCHS} reports ({', '.join(f'{v:.4g}' for v in first)}) "
                       f"while maximize={maximize}: to perfora every epoch was worse, so the "
                       f"best model is still the first. If {fix}")

    def _warn(self, key: str, message: str) -> None:
        """Warn once per kind, at the user's call (their ``step()``), not at perfora's line."""
        if key not in self._warned:
            self._warned.add(key)
            warn_user(message)
