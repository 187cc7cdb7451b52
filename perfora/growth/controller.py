"""The growth controller: validation scores in, decisions out (continue, restructure, complete).

An explicit object: several can live in one process. A coordinator: the policy decides,
the surgery changes the model, the optimizer slot rebuilds what trains, the parallel
backend re-wraps or re-shards, the run writer writes the files, and a checkpointer (a file
or a DCP folder) writes the run's payload and reads it back for the one restore path here.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint.schema import with_keys_of
from ..config import PerforaConfig
from ..distributed.collectives import is_distributed
from ..distributed.exit_settle import settle_at_exit
from ..errors import OrderError, PerforationError, require_bool
from ..nn.layers import dendritic_layers
from ..parallel import ParallelBackend, backend_of
from ..rules import make_rule
from . import surgery
from .compile_room import make_room_for_recompiles
from .history_marks import decision_cells
from .neuron_growth import arm_widening_signal, check_neuron_growth, grow_neurons
from .on_request import OnRequestMethods
from .optimizer_slot import OptimizerMethods, OptimizerSlot
from .persistence import CheckpointMethods
from .placement import check_reported_model
from .policy import carries_optimizer, growth_may_come_next, observe
from .run_writer import RunWriter
from .saved_run import Checkpointer, RunParts, SavedRun
from .scores import read_scores, update_arch
from .signal import ErrorSignalProbe
from .state import Action, BestSnapshot, ControllerState, Decision
from .usage import UsageWatch
from .views import ControllerViews
from .widening_signal import WideningSignal


class GrowthController(ControllerViews, OnRequestMethods, OptimizerMethods,
                       CheckpointMethods):
    """Decides, once per epoch, whether to keep training, grow (dendrites, neurons) or stop.

    ``model`` must already be perforated (see :func:`perfora.perforate`); it may be wrapped
    in ``DistributedDataParallel`` or ``DataParallel``: then every decision that changes what
    trains returns a new wrapper of the same kind, built with the same arguments, in
    ``decision.model`` (use it from then on). Settings come from ``config`` (a PerforaConfig
    or a mapping of settings) and/or keyword arguments (``GrowthController(model,
    maximize=False)``). With ``run_dir`` the controller writes checkpoints, metrics.csv,
    best_arch_scores.csv, history.png and run.json there.
    """

    def __init__(self, model: nn.Module,
                 config: PerforaConfig | Mapping[str, Any] | None = None, *,
                 run_dir: str | Path | None = None, write_files: bool = True,
                 **settings: Any) -> None:
        config = PerforaConfig.coerce(config)
        if settings:
            config = config.replace(**settings)
        write_files = require_bool(write_files, "write_files")  # before the model changes
        self.config, self.model = config, model
        self.backend: ParallelBackend = backend_of(model)
        if is_distributed():
            settle_at_exit()  # gloo's worker threads finish their work before Python ends
        self._retired: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # replaced DDP wrappers
        layers = dendritic_layers(model)
        if not layers:
            raise PerforationError("the model has no dendritic layers: call "
                                   "perfora.perforate(model) before creating the controller")
        self.backend.check_rule(config.rule)
        self.backend.check_config(config)
        if config.growth != "dendrites" and not check_neuron_growth(model, self.backend,
                                                                     config):
            self.config = config = config.replace(max_neuron_steps=0)  # auto: dendrites only
        self._signal = WideningSignal(convs=config.conv_gradmax) \
            if config.growth != "dendrites" and config.neuron_init == "gradmax" else None
        surgery.apply_activation(layers, config.activation)
        for layer in layers.values():
            layer.remember_frozen_base()  # frozen by the user: stays frozen in every phase
        self._usage = UsageWatch()
        self._usage.watch_calls(layers)
        self.rule = make_rule(config.rule, config)
        self.rule.bind_model(model)
        self.rule.apply(layers)
        self.state = ControllerState()
        surgery.count_structure(self.state, model)
        self._probe = ErrorSignalProbe(config.signal_rows) if config.uses_error_signal() \
            else None
        self._slot = OptimizerSlot()
        self._best: BestSnapshot | None = None  # the best model so far, for the rewind
        self._last_time = time.perf_counter()
        self._writer = RunWriter(config, run_dir, write_files, self.resume_hint)
        self._take_engine_optimizer()
        self._arm_probe()

    def _layers(self) -> dict[str, Any]:
        """The dendritic layers of the current model, by path."""
        return dendritic_layers(self.model)

    def parameter_count(self) -> int:
        """Parameters of the model, as deployed (no hidden copies)."""
        return self.backend.parameter_count(self.model)

    def _adopt(self, model: nn.Module | None) -> None:
        """Check ``model`` is this controller's (not a retired wrapper), then use its kind;
        note what the user froze or unfroze since (growth keeps it)."""
        for layer in self._layers().values():
            layer.remember_frozen_base()
        if model is None:
            return
        check_reported_model(self.model, model, self._retired)
        if model is not self.model:
            self.model = model
            self.backend = backend_of(model)
            self._take_engine_optimizer()

    def _take_engine_optimizer(self) -> None:
        """Under DeepSpeed the engine builds the optimizer (and its scheduler): take it."""
        if self.backend.owns_optimizer:
            self._slot.hand_over(self.backend.engine_optimizer(self.model))

    def _unshard(self) -> None:
        """Sharded: swap the model for an unsharded copy with the full state (collective)."""
        self._swap(self.backend.unshard(self.model))

    def _swap(self, model: nn.Module) -> None:
        """Train ``model`` from now on (a copy or a re-sharded model the backend built)."""
        if model is not self.model:
            self.model = model
            self.rule.bind_model(self.model)

    def _sync_structure(self) -> None:
        """Check every rank has the same structure, then re-wrap DDP/DataParallel."""
        old = self.model
        self.model = self.backend.rewrap(old)
        if self.backend.replaces_wrappers and self.model is not old:
            self._retired.add(old)
        self._take_engine_optimizer()

    def _rebuild_after_change(self) -> None:
        """After a structure or trainables change: re-wrap, then rebuild the optimizer. The
        widening signal recorded so far belongs to the old structure: it is dropped."""
        if self._signal is not None:
            self._signal.clear()
        self._sync_structure()
        self._slot.after_restructure(self.model, self.config.maximize)
        self._take_engine_optimizer()

    def _grow_kind(self) -> str:
        """What the next growth step adds: the config's kind, or auto's choice."""
        return self.state.auto_kind if self.config.growth == "auto" else self.config.growth

    def _carries(self, kind: str | None) -> bool:
        """True when the optimizer's state goes on through a growth step of ``kind``."""
        return carries_optimizer(self.config, self.state, kind)

    def _grow(self, kind: str | None = None, kept: bool = False) -> str:
        """Grow ``kind`` (default: the config's, or auto's choice), rebuild what trains, and
        say where: a neuron step's layers, selective sets' neurons ('' for full sets).
        ``kept``: the optimizer's state was kept already (before a rewind)."""
        kind = kind or self._grow_kind()
        if kind == "neurons":
            if not kept:
                self._slot.keep_for_widening(self.model, self.backend)
            before = {id(p) for p in self.model.parameters()}
            model, step = self.backend.widen(self.model, lambda structure, scope: grow_neurons(
                structure, self.config, self.state, self._signal, scope))
            added = step.describe()
            if self._probe is not None:
                self._probe.clear()
            self._swap(model)
            self.rule.apply(self._layers())
            self._rebuild_after_change()
            self._slot.carry_after_widening(self.model, self.backend)
            self._usage.after_restructure(self._layers(), kept=before)
            make_room_for_recompiles(self.state.additions + 1)
            return added
        if not kept and self._carries(kind):
            self._slot.keep_for_widening(self.model, self.backend)
        self._swap(surgery.grow(self.model, self.backend, self.config, self.state,
                                self._probe))
        self.rule.after_growth(self._layers())
        self._rebuild_after_change()
        if self._carries(kind):
            self._slot.carry_after_widening(self.model, self.backend)
        if not self.backend.sharded:
            self._usage.after_restructure(self._layers())
        make_room_for_recompiles((self.state.additions if self.config.growth == "auto"
                                  else self.state.num_dendrites) + 1)
        return surgery.describe_newest_sets(self._layers())

    def _rewind_to_best(self) -> None:
        """Give the model the best snapshot's structure and weights (nothing without one)."""
        if self._best is not None:
            self._swap(surgery.rewind_to_best(self.model, self.backend, self.rule,
                                              self.state, self._best))

    def _arm_probe(self) -> None:
        """Record the error signal only in an epoch that a growth step may follow."""
        surgery.arm_probe(self._probe, self.model, self.state, self.config, self.rule)
        template = self.backend.template if self.backend.sharded else None
        arm_widening_signal(self._signal, self.model, growth_may_come_next(
            self.state, self.config, self.rule.phase == self.rule.neuron_phase), template,
            self.config.neuron_pairs)

    def step(self, score: Any, *, test_score: Any = None,
             extra: Mapping[str, Any] | None = None,
             model: nn.Module | None = None, weight: float = 1.0) -> Decision:
        """Report one epoch's validation score; returns what to do next.

        ``test_score`` is recorded at the best-validation epoch; ``extra`` holds named
        scores written to metrics.csv and drawn in history.png. Under torch.distributed
        every rank must call this; the scores are averaged over ranks (weighted by
        ``weight``, e.g. the size of each rank's validation shard) so that every rank
        takes the same decision. ``model``: the model you train with (its DDP/DataParallel
        wrapper, or the bare module); after a restructure, ``decision.model`` is of the same
        kind (a new wrapper built with the original arguments, or the bare module).
        """
        if self.state.completed:
            raise OrderError("step() after training completed: the controller already "
                             "restored the best model; stop the loop when decision.complete")
        self._adopt(model)
        self._slot.pending_carry = None  # a neuron step's moments wait one epoch at most
        self._usage.end_epoch(self._slot.expected, self._slot.awaiting_instance)
        value, test, extras = read_scores(score, test_score, extra, weight)
        self._usage.check_report(self.model, self.backend, self.state, value,
                                 self.config.maximize)
        now = time.perf_counter()
        seconds, self._last_time = now - self._last_time, now
        st = self.state
        st.epoch += 1
        row: dict[str, Any] = {"epoch": st.epoch, "phase": self.rule.phase,
                               "dendrites": st.num_dendrites, "val_score": value,
                               "test_score": test, "lr": self._slot.lr(),
                               "params": self.parameter_count(), "seconds": seconds,
                               "event": "", **{f"extra/{k}": v for k, v in extras.items()},
                               **({"widenings": st.num_widenings}
                                  if self.config.growth != "dendrites" else {})}
        rule_step = self.rule.end_epoch(value, self._layers())
        row.update({f"rule/{k}": v for k, v in self.rule.metrics().items()})
        if rule_step.handled:
            row["running_score"] = None
            action, reason = Action.CONTINUE, rule_step.reason or f"{self.rule.phase} phase"
            if rule_step.trainables_changed:
                self._rebuild_after_change()
                action, row["event"] = Action.PHASE_CHANGE, "phase_change"
            return self._finish_step(row, action, reason)
        verdict = observe(st, self.config, value, test)
        self.state = verdict.state
        row["running_score"] = verdict.running
        update_arch(self.state, self.config, verdict.running, test, self.parameter_count())
        if verdict.improved_best:
            self._best = surgery.snapshot_best(self.model, self.backend)
        kind = self._grow_kind() if verdict.grow else None
        row.update(decision_cells(kind, self.state.best_epoch
                                  if verdict.rewind and self._best is not None else None))
        if self._carries(kind):
            # kept before the rewind: under FSDP and ZeRO-3 the rewind re-shards, and the
            # optimizer then holds parameters the model no longer has
            self._slot.keep_for_widening(self.model, self.backend)
        if verdict.rewind:
            self._rewind_to_best()
            if self._carries(kind):
                self._slot.narrow_kept(self.model, self.backend)
        added = self._grow(kind, kept=True) if verdict.grow else ""
        if verdict.action == Action.COMPLETE and verdict.rewind:
            self._rebuild_after_change()  # as restore_best(): the optimizer over the best model
        elif verdict.action == Action.COMPLETE:
            self._sync_structure()
        reason = verdict.describe(self.state.num_dendrites, self.state.num_widenings) + (
            f" ({added})" if added else "")
        if verdict.action == Action.CONTINUE:
            self._slot.step_scheduler(value, self.config.maximize)
        else:
            row["event"] = verdict.action.value
        return self._finish_step(row, verdict.action, reason, verdict.improved_best)

    def _finish_step(self, row: dict[str, Any], action: str, reason: str,
                     improved_best: bool = False) -> Decision:
        row["reason"] = reason if action != Action.CONTINUE else ""
        self.state.history.append(row)
        self._writer.end_epoch(self._parts(), self.checkpoint_path, action, improved_best)
        self._arm_probe()
        self._last_time = time.perf_counter()
        return self._decision(action, reason)

    def _decision(self, action: str, reason: str) -> Decision:
        """The one place a Decision is built: the action with the controller's current parts."""
        return Decision(action=action, reason=reason, model=self.model,
                        optimizer=self.optimizer, scheduler=self.scheduler,
                        epoch=self.state.epoch, num_dendrites=self.state.num_dendrites,
                        phase=self.rule.phase)

    def finish(self) -> None:
        """Write the summary tables and graph now (also done at restructures and the end)."""
        self._writer.finish(self._parts(), self.checkpoint_path)

    def checkpoint_path(self, name: str) -> Path:
        """Where checkpoint ``name`` (``latest``, ``best``, ``switch_N``) is written in run_dir:
        ``<name>.safetensors``, or the ``<name>.dcp`` folder when ``checkpoint_format`` makes
        this run write DCP checkpoints."""
        if self.run_dir is None:
            raise OrderError("no run_dir: give GrowthController(..., run_dir=...) or pass a "
                             "full path")
        return self._writer.checkpoint_path(name, self.backend)

    # ------------------------------------------------------------------ checkpoints
    def _parts(self) -> RunParts:
        """The parts of the run a checkpoint is made of, as they are now."""
        return RunParts(self.model, self.backend, self.config, self.state, self.rule,
                        self._slot, self._best, self._writer.history_rows)

    def _restore(self, run: SavedRun, reader: Checkpointer | None = None,
                 rehearsed: bool = False) -> None:
        """The one restore path. With a ``reader`` (a file or DCP folder): checked (and
        rehearsed) first, then its structure and weights, the controller and rule state,
        the optimizer's; without (a framework's state): the state and best snapshot only.
        The history before the checkpoint's newest rows is read back from the metrics.csv
        next to it, and metrics.csv is rewritten with the rows up to its epoch."""
        state, best = run.state(), run.best
        if reader is not None:
            reader.check(self._parts(), run, rehearsed)
            self._unshard()
            reader.load_structure(self.model, run)
            surgery.count_structure(state, self.model)  # "best" may hold less than the run
        self.state = state
        self.rule.load_state_dict(run.rule, self._layers())
        if reader is not None:
            self._rebuild_after_change()  # re-shard / re-wrap, rebuild the optimizer
            best = reader.load_rest(self._parts(), run)
            if self.scheduler is not None and run.scheduler is not None:
                self.scheduler.load_state_dict(with_keys_of(run.scheduler,
                                                            self.scheduler.state_dict()))
        self._best, self._writer.best_unsaved = best, False
        if self._writer.report is not None:
            self.state.history = self._writer.report.resume_history(
                self.state.history, self.state.epoch, run.metrics)
        self._arm_probe()
        self._last_time = time.perf_counter()

    def match_structure(self, specs: Mapping[str, Mapping[str, Any]]) -> nn.Module:
        """Give the model a saved dendrite structure before its weights are loaded elsewhere.

        Under FSDP2 the model is unsharded, resized and sharded again (a collective); the
        returned model replaces the old one. The new dendrites hold zeros until the load.
        A structure that is malformed or does not fit raises CheckpointError before the
        model changes."""
        self._swap(surgery.match_structure(self.model, self.backend, self.state, specs))
        self.rule.apply(self._layers())
        self._sync_structure()
        return self.model

    @property
    def best_snapshot(self) -> tuple[dict, dict[str, torch.Tensor]] | None:
        """(structure, tensors) of the best model so far, kept in memory for the rewind.

        Under FSDP2 the snapshot holds each rank's shards: call it on every rank (the
        tensors are gathered whole)."""
        if self._best is None:
            return None
        return self._best.structure, self.backend.whole(self._best.tensors)
