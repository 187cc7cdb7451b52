"""The growth controller: validation scores in, decisions out (continue, restructure, complete).

An explicit object: several can live in one process. It owns the best-model snapshot it
rewinds to, the optimizer/scheduler recipes it rebuilds after every restructure, and the
run files it writes.
"""

from __future__ import annotations

import copy
import time
import warnings
import weakref
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._version import __version__
from ..candidates import GrowthPlan, plan_growth
from ..checkpoint import (
    Checkpoint,
    atomic_write_bytes,
    encode_checkpoint,
    fit_structure,
    load_checkpoint,
    load_state_into,
    rehearse_load,
    save_checkpoint,
    shadow_copy,
    to_storable,
)
from ..checkpoint_schema import (
    check_like,
    validate_controller_state,
    validate_rule_state,
    validate_structure,
)
from ..config import PerforaConfig
from ..errors import (
    CheckpointError,
    ConversionError,
    OrderError,
    PerforationError,
    ScoreError,
)
from ..layers import dendritic_layers, unwrap_model
from ..optim import (
    OptimizerRecipe,
    SchedulerRecipe,
    join_optimizer_state,
    step_scheduler,
)
from ..parallel import ParallelBackend, backend_of
from ..parallel.collectives import agree_on_scores, all_reduce_values, barrier, is_rank_zero
from ..perforation import layer_specs, rebuild_structure
from ..report import RunReport
from ..rules import make_rule
from ..signal import ErrorSignalProbe
from ..usage import UsageWatch
from .optimizer_slot import OptimizerSlot
from .policy import Verdict, growth_may_come_next, observe
from .state import (
    COMPLETE,
    CONTINUE,
    PHASE_CHANGE,
    RESTRUCTURE,
    BestSnapshot,
    ControllerState,
    Decision,
    as_score,
)

CHECKPOINT_SUFFIX = ".safetensors"


class GrowthController:
    """Decides, once per epoch, whether to keep training, add dendrites, or stop.

    ``model`` must already be perforated (see :func:`perfora.perforate`); it may be wrapped
    in ``DistributedDataParallel`` or ``DataParallel``: then every decision that changes what
    trains returns a new wrapper of the same kind, built with the same arguments, in
    ``decision.model`` (use it from then on). Settings come
    from ``config`` and/or keyword arguments (``GrowthController(model, maximize=False)``).
    With ``run_dir`` the controller writes checkpoints, metrics.csv, best_arch_scores.csv,
    history.png and run.json there.
    """

    def __init__(self, model: nn.Module, config: PerforaConfig | None = None, *,
                 run_dir: str | Path | None = None, write_files: bool = True,
                 **settings: Any) -> None:
        config = config if config is not None else PerforaConfig()
        if settings:
            config = config.replace(**settings)
        self.config = config
        self.model = model
        self.backend: ParallelBackend = backend_of(model)
        self._full_cache: dict[str, torch.Tensor] | None = None  # FSDP2: gathered state
        self._optim_cache: tuple[dict[str, torch.Tensor], dict] | None = None  # and optimizer
        self._retired: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # replaced DDP wrappers
        layers = dendritic_layers(model)
        if not layers:
            raise PerforationError("the model has no dendritic layers: call "
                                   "perfora.perforate(model) before creating the controller")
        self.backend.check_rule(config.rule)
        _apply_activation(layers, config.activation)
        for layer in layers.values():
            layer.remember_frozen_base()  # frozen by the user: stays frozen in every phase
        self._usage = UsageWatch()
        self._usage.watch_calls(layers)
        self.rule = make_rule(config.rule, config)
        self.rule.bind_model(model)
        self.rule.apply(layers)
        self.state = ControllerState(num_dendrites=self._layer_dendrites())
        self._probe = ErrorSignalProbe(config.signal_rows) if config.uses_error_signal() \
            else None
        self._slot = OptimizerSlot()
        self._best: BestSnapshot | None = None
        self._last_time = time.perf_counter()
        self._last_write = time.perf_counter()
        self._write_cost = 0.0
        self._best_unsaved = False
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.write_files = write_files
        self._report = RunReport(self.run_dir) if self._writes() else None
        if self._report is not None:
            self._report.write_run_json({"perfora_version": __version__,
                                         "torch_version": torch.__version__,
                                         "config": config.to_dict()})
        self._update_probe()

    # ------------------------------------------------------------------ helpers
    def _writes(self) -> bool:
        return self.run_dir is not None and self.write_files and is_rank_zero()

    def _layers(self):
        return dendritic_layers(self.model)

    def _layer_dendrites(self) -> int:
        counts = {layer.num_dendrites for layer in self._layers().values()}
        return max(counts) if counts else 0

    @property
    def num_dendrites(self) -> int:
        """Dendrite sets currently in every wrapped layer."""
        return self.state.num_dendrites

    @property
    def epoch(self) -> int:
        """Epochs reported so far."""
        return self.state.epoch

    @property
    def completed(self) -> bool:
        return self.state.completed

    @property
    def best_score(self) -> float | None:
        """The best (smoothed) validation score so far."""
        return self.state.global_best

    @property
    def phase(self) -> str:
        return self.rule.phase

    def parameter_count(self) -> int:
        """Parameters of the model, as deployed (no hidden copies)."""
        return self.backend.parameter_count(self.model)

    # ---------------------------------------------------------- optimizer setup
    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer in use (built by perfora, yours, or a framework's)."""
        return self._slot.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        self._slot.optimizer = optimizer

    @property
    def scheduler(self) -> Any:
        """The LR scheduler in use (None without one)."""
        return self._slot.scheduler

    @scheduler.setter
    def scheduler(self, scheduler: Any) -> None:
        self._slot.scheduler = scheduler

    def set_optimizer(self, cls: type[torch.optim.Optimizer], **kwargs: Any) -> None:
        """Register the optimizer class and arguments; rebuilt after every restructure."""
        self._slot.set_recipe(cls, kwargs)

    def set_scheduler(self, cls: type, **kwargs: Any) -> None:
        """Register the LR scheduler class and arguments (stepped by the controller)."""
        self._slot.set_scheduler(cls, kwargs)

    def build_optimizer(self) -> tuple[torch.optim.Optimizer, Any]:
        """(Re)build optimizer and scheduler over the currently trainable parameters."""
        return self._slot.build(self.model, self.config.maximize)

    def set_optimizer_instance(self, optimizer: torch.optim.Optimizer,
                               scheduler: Any = None) -> None:
        """Use an optimizer you built. After a restructure you must rebuild it yourself."""
        self._slot.set_instance(optimizer, scheduler)

    def hand_over_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        """A framework's optimizer (Lightning, HF Trainer): read for the learning rate and
        saved in checkpoints, never rebuilt by perfora (the framework rebuilds it)."""
        self._slot.hand_over(optimizer)

    def _adopt(self, model: nn.Module) -> None:
        """Return ``model``'s kind from now on (the DDP wrapper, or the bare module)."""
        if model is not self.model:
            self.model = model
            self.backend = backend_of(model)

    def _unshard(self) -> None:
        """Sharded: swap the model for an unsharded copy with the full state (collective)."""
        plain = self.backend.unshard(self.model)
        if plain is not self.model:
            self.model = plain
            self.rule.bind_model(self.model)

    def _model_state(self) -> dict[str, torch.Tensor]:
        """The full model state; sharded, a collective unless gathered for this write."""
        if self._full_cache is not None:
            return self._full_cache
        return self.backend.full_state(self.model)

    def _optimizer_state(self) -> tuple[dict[str, torch.Tensor], dict] | None:
        """(tensors, JSON) of the optimizer state; under FSDP2 full tensors by parameter name.

        Under FSDP2 a collective (every rank gathers its shards) unless gathered for this
        write; the names let a resumed run match entries whatever order its optimizer has.
        None without an optimizer, or when it is stale (it holds replaced parameters)."""
        if self.optimizer is None:
            return None
        if self._full_cache is not None:  # gathered together with the model
            return self._optim_cache
        return self.backend.optimizer_state(self.optimizer, self.model)

    def _gather_for_write(self, due: bool = True) -> None:
        """FSDP2: gather the full model and optimizer state on every rank; rank 0 writes."""
        if due and self.backend.sharded and self.run_dir is not None and self.write_files \
                and self.config.save_checkpoints:
            optimizer = self._optimizer_state()
            self._full_cache = to_storable(self.backend.full_state(self.model))
            self._optim_cache = optimizer

    def _drop_gathered(self) -> None:
        """Free the state gathered for a write (FSDP2)."""
        self._full_cache = self._optim_cache = None

    def _sync_structure(self) -> None:
        """Check every rank has the same structure, then re-wrap DDP/DataParallel."""
        old = self.model
        self.model = self.backend.rewrap(old)
        if self.backend.replaces_wrappers and self.model is not old:
            self._retired.add(old)

    def _rebuild_after_change(self) -> None:
        self._sync_structure()
        self._slot.after_restructure(self.model, self.config.maximize)

    # ------------------------------------------------------------ the decision
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
        st = self.state
        if st.completed:
            raise OrderError("step() after training completed: the controller already "
                             "restored the best model; stop the loop when decision.complete")
        if model is not None and unwrap_model(model) is not unwrap_model(self.model):
            raise OrderError("step() got a different model from the one this controller was "
                             "created with; pass the same model (or its DDP/DataParallel "
                             "wrapper)")
        if model is not None and model in self._retired:
            raise OrderError("step() got a DistributedDataParallel wrapper that perfora "
                             "replaced at an earlier restructure: its gradient buckets do not "
                             "cover the new dendrites, so the ranks may have diverged. After "
                             "every decision with restructured=True (or complete=True) use "
                             "decision.model and decision.optimizer")
        if model is not None:
            self._adopt(model)
        self._usage.end_epoch(self._slot.expected)
        value = as_score(score)
        test = None if test_score is None else as_score(test_score, "test score")
        extras = {k: as_score(v, f"extra score {k!r}") for k, v in (extra or {}).items()}
        weight = as_score(weight, "weight")
        if weight <= 0:
            raise ScoreError(f"weight must be > 0 (e.g. the size of this rank's validation "
                             f"shard), got {weight}")
        value, test, *extra_values = agree_on_scores([value, test, *extras.values()],
                                                     weight=float(weight))
        extras = dict(zip(extras, extra_values))
        now = time.perf_counter()
        seconds, self._last_time = now - self._last_time, now
        st.epoch += 1
        row: dict[str, Any] = {"epoch": st.epoch, "phase": self.rule.phase,
                               "dendrites": st.num_dendrites, "val_score": value,
                               "test_score": test, "lr": self._slot.lr(),
                               "params": self.parameter_count(), "seconds": seconds,
                               "event": ""}
        row.update({f"extra/{k}": v for k, v in extras.items()})

        rule_step = self.rule.end_epoch(value, self._layers())
        row.update({f"rule/{k}": v for k, v in self.rule.metrics().items()})
        if rule_step.handled:
            row["running_score"] = None
            action, reason = CONTINUE, rule_step.reason or f"{self.rule.phase} phase"
            if rule_step.trainables_changed:
                self._rebuild_after_change()
                action, row["event"] = PHASE_CHANGE, "phase_change"
            return self._finish_step(row, action, reason)

        verdict = observe(st, self.config, value, test)
        self.state = verdict.state
        row["running_score"] = verdict.running
        self._update_arch(verdict.running, test)
        if verdict.improved_best:
            self._snapshot_best()
        reason = self._act(verdict)
        if verdict.action == CONTINUE:
            self._slot.step_scheduler(value, self.config.maximize)
        else:
            row["event"] = verdict.action.value
        return self._finish_step(row, verdict.action, reason, verdict.improved_best)

    def _act(self, verdict: Verdict) -> str:
        """Carry out a verdict (rewind, grow, re-wrap at the end); returns its reason."""
        if verdict.rewind:
            self._rewind_to_best()
        if verdict.grow:
            self._grow()
        if verdict.action == COMPLETE:
            self._sync_structure()  # the rewind may have replaced parameters: fresh wrapper
        return verdict.describe(self.state.num_dendrites)

    def _update_arch(self, running: float, test: float | None) -> None:
        key = str(self.state.num_dendrites)
        entry = self.state.arch.get(key)
        better = entry is None or (running > entry["best_val_score"] if self.config.maximize
                                   else running < entry["best_val_score"])
        if better:
            self.state.arch[key] = {"dendrites": self.state.num_dendrites,
                                    "params": self.parameter_count(),
                                    "best_val_score": running, "test_score": test,
                                    "epoch": self.state.epoch}

    def _update_probe(self) -> None:
        """Record the error signal only in an epoch that a growth step may follow."""
        if self._probe is None:
            return
        self._probe.disarm()  # the layers may be new objects (FSDP2 re-shards a copy)
        if growth_may_come_next(self.state, self.config,
                                self.rule.phase == self.rule.neuron_phase):
            self._probe.arm(self._layers())
        else:
            self._probe.clear()

    def _plan_growth(self, layers: Mapping[str, Any]) -> dict[str, GrowthPlan]:
        """Per layer, the next set's neurons and weights from the recorded error signal.

        A layer without recorded rows on some rank (or of a kind the probe cannot read)
        grows a full set with random weights, on every rank alike."""
        cfg, probe = self.config, self._probe
        if probe is None:
            return {}
        paths = sorted(layers)
        counts = torch.tensor([probe.row_count(p) for p in paths], dtype=torch.int64)
        counts = all_reduce_values(counts, "min")
        plans: dict[str, GrowthPlan] = {}
        for index, path in enumerate(paths):
            if int(counts[index]) < 2:
                continue
            x, e = probe.samples(path)  # type: ignore[misc]
            seed = zlib.crc32(f"{cfg.seed}:{self.state.additions}:{index}:{path}:pool".encode())
            plans[path] = plan_growth(
                layers[path], x, e, generator=torch.Generator().manual_seed(seed),
                fraction=cfg.grow_fraction, train_pool=cfg.dendrite_init == "error",
                pool=cfg.candidate_pool, steps=cfg.candidate_steps, lr=cfg.candidate_lr,
                scale=cfg.dendrite_init_scale)
        probe.clear()
        return plans

    def _finish_step(self, row: dict[str, Any], action: str, reason: str,
                     improved_best: bool = False) -> Decision:
        st = self.state
        row["reason"] = reason if action != CONTINUE else ""
        st.history.append(row)
        # FSDP2: the gather is a collective, so every rank decides alike (no time budget)
        self._gather_for_write(action != CONTINUE or st.epoch % self.config.latest_every == 0)
        if self._writes():
            self._write_run_files(action, improved_best)
        self._drop_gathered()
        self._update_probe()
        self._last_time = time.perf_counter()
        return self._decision(action, reason)

    def _decision(self, action: str, reason: str) -> Decision:
        """The one place a Decision is built: the action with the controller's current parts."""
        return Decision(action=action, reason=reason, model=self.model,
                        optimizer=self.optimizer, scheduler=self.scheduler,
                        epoch=self.state.epoch, num_dendrites=self.state.num_dendrites,
                        phase=self.rule.phase)

    # ------------------------------------------------------------ growth
    def _snapshot_best(self) -> None:
        inner = unwrap_model(self.model)
        self._best = BestSnapshot(layer_specs(inner), to_storable(self._model_state()))

    def _rewind_to_best(self) -> None:
        if self._best is None:
            return
        specs, weights = self._best.as_tuple()
        self._unshard()
        rebuild_structure(self.model, specs)
        load_state_into(self.model, weights, "the best-model snapshot")
        self.state.num_dendrites = self._layer_dendrites()
        self.rule.apply(self._layers())

    def _grow(self) -> None:
        st = self.state
        self._unshard()
        layers = self._layers()
        plans = self._plan_growth(layers)
        init = "default" if self.config.dendrite_init == "error" else self.config.dendrite_init
        for index, (path, layer) in enumerate(sorted(layers.items())):
            seed = zlib.crc32(f"{self.config.seed}:{st.additions}:{index}:{path}".encode())
            gen = torch.Generator().manual_seed(seed)
            plan = plans.get(path)
            layer.grow(gen, init=init, scale=self.config.dendrite_init_scale,
                       neurons=plan.neurons if plan else None,
                       weights=plan.weights if plan else None)
        st.additions += 1
        st.num_dendrites = self._layer_dendrites()
        st.switch_epochs.append(st.epoch)
        st.cycle_start_epoch = st.last_improved_epoch = st.epoch
        st.cycle_scores, st.cycle_best, st.cycle_set_global_best = [], None, False
        self.rule.after_growth(layers)
        self._rebuild_after_change()
        if not self.backend.sharded:
            self._usage.after_restructure(self._layers())

    def add_dendrites(self) -> Decision:
        """Add one dendrite set now (without waiting for a plateau); rebuilds the optimizer."""
        if self.state.completed:
            raise OrderError("add_dendrites() after training completed")
        self._grow()
        self._gather_for_write()
        if self._writes():
            self._write_checkpoint(f"switch_{len(self.state.switch_epochs)}")
        self._drop_gathered()
        return self._decision(RESTRUCTURE, "added on request")

    # ------------------------------------------------------------ run files
    def _write_run_files(self, action: str, improved_best: bool) -> None:
        st, cfg = self.state, self.config
        assert self._report is not None
        self._report.write_metrics(st.history)
        if cfg.save_checkpoints:
            self._best_unsaved |= improved_best
            # restructures and the end are written now; plain epochs only when the time
            # since the last write pays for it (checkpoint_time_budget), so a tiny model is
            # not slowed down by writing every epoch and a big one still writes every epoch
            budget = cfg.checkpoint_time_budget
            due = self._full_cache is not None if self.backend.sharded else action != CONTINUE or (
                st.epoch % cfg.latest_every == 0 and (
                    budget is None
                    or time.perf_counter() - self._last_write >= self._write_cost / budget))
            if due:
                self._write_checkpoints(action)
        if action != CONTINUE:
            self._write_summaries()

    def _write_summaries(self) -> None:
        if self._report is None:
            return
        rows = [self.state.arch[k] for k in sorted(self.state.arch, key=int)]
        self._report.write_arch_table(rows)
        self._report.draw_history(self.state.history, self.state.switch_epochs,
                                  self.config.maximize)

    def finish(self) -> None:
        """Write the summary tables and graph now (also done at restructures and the end)."""
        self._gather_for_write(bool(self.state.history))
        if self._writes():
            if self.config.save_checkpoints and self.state.history:
                self._write_checkpoints(CONTINUE)
            self._write_summaries()
        self._drop_gathered()

    def checkpoint_path(self, name: str) -> Path:
        if self.run_dir is None:
            raise OrderError("no run_dir: give GrowthController(..., run_dir=...) or pass a "
                             "full path")
        return self.run_dir / f"{name}{CHECKPOINT_SUFFIX}"

    def _write_checkpoint(self, name: str) -> None:
        self.save(self.checkpoint_path(name))

    def _write_checkpoints(self, action: str) -> None:
        """latest (+ switch_N at a restructure, + best if it changed), each encoded once."""
        start = time.perf_counter()
        data = encode_checkpoint(self.to_checkpoint())
        if action == RESTRUCTURE:
            atomic_write_bytes(self.checkpoint_path(f"switch_{len(self.state.switch_epochs)}"),
                               data)
        atomic_write_bytes(self.checkpoint_path("latest"), data)
        if self._best_unsaved and self._best is not None:
            # "best" holds the best model itself, even if the model grew since
            best = encode_checkpoint(self.to_checkpoint(model_from_best=True))
            atomic_write_bytes(self.checkpoint_path("best"), best)
            self._best_unsaved = False
        self._last_write = time.perf_counter()
        self._write_cost = self._last_write - start

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Controller + rule state (JSON-able)."""
        return {"controller": self.state.to_dict(), "rule": self.rule.state_dict(),
                "config": self.config.to_dict()}

    def to_checkpoint(self, model_from_best: bool = False) -> Checkpoint:
        """Everything needed to resume exactly: model, best snapshot, optimizer, state.

        ``model_from_best``: the model tensors and structure are the best snapshot."""
        inner = unwrap_model(self.model)
        tensors: dict[str, dict[str, torch.Tensor]] = {"model": self._model_state()}
        meta: dict[str, Any] = {"structure": layer_specs(inner), **self.state_dict(),
                                "perfora_version": __version__}
        optimizer = self._optimizer_state()
        if model_from_best and self._best is not None:
            if self._best.structure != meta["structure"]:
                optimizer = None  # the moments belong to the grown model, not the best one
            meta["structure"], tensors["model"] = self._best.as_tuple()
        if self._best is not None:
            tensors["best"] = self._best.tensors
            meta["best_structure"] = self._best.structure
        if optimizer is not None:
            opt_tensors, opt_meta = optimizer
            tensors["optimizer"] = opt_tensors
            meta["optimizer"] = opt_meta
            meta["optimizer_class"] = type(self.optimizer).__qualname__
        if self.scheduler is not None:
            meta["scheduler"] = _jsonable_or_none(self.scheduler.state_dict())
        return Checkpoint(tensors=tensors, meta=meta)

    def match_structure(self, specs: Mapping[str, Mapping[str, Any]]) -> nn.Module:
        """Give the model a saved dendrite structure before its weights are loaded elsewhere.

        Under FSDP2 the model is unsharded, resized and sharded again (a collective); the
        returned model replaces the old one. The new dendrites hold zeros until the load.
        A structure that is malformed or does not fit raises CheckpointError before the
        model changes."""
        specs = validate_structure(specs, "structure")
        shadow = self.backend.shadow(self.model)
        if shadow is not None:
            fit_structure(shadow, specs, "the saved structure does not fit this model")
        self._unshard()
        fit_structure(self.model, specs, "the saved structure does not fit this model")
        self.state.num_dendrites = self._layer_dendrites()
        self.rule.apply(self._layers())
        self._sync_structure()
        return self.model

    @property
    def best_snapshot(self) -> tuple[dict, dict[str, torch.Tensor]] | None:
        """(structure, tensors) of the best model so far, kept in memory for the rewind."""
        return None if self._best is None else self._best.as_tuple()

    def load_state(self, meta: Mapping[str, Any],
                   best: Mapping[str, torch.Tensor] | None = None) -> None:
        """Restore the controller, rule and best snapshot without touching the weights.

        For frameworks that restore the weights themselves (Lightning): the model must
        already have the saved structure. ``meta`` is :meth:`state_dict` plus
        ``best_structure``; ``best`` the best snapshot's tensors. Everything is checked
        first: a state that is malformed or does not fit raises CheckpointError and leaves
        the controller as it was."""
        if not isinstance(meta, Mapping) or "controller" not in meta:
            raise CheckpointError("the saved perfora state has no controller entry")
        state = _checked_state(meta["controller"])
        rule_state = meta.get("rule", {})
        best_structure = meta.get("best_structure")
        try:
            validate_rule_state(rule_state, structure=layer_specs(self.model))
            if best_structure is not None:
                best_structure = validate_structure(best_structure, "best_structure")
        except CheckpointError as exc:
            raise CheckpointError(f"the saved perfora state: {exc}") from None
        shadow = self.backend.shadow(self.model)
        if shadow is not None:
            _rehearse_rule(shadow, self.config, rule_state, "the saved perfora state")
            if best is not None and best_structure is not None:
                fit_structure(shadow, best_structure, "the saved best structure")
                rehearse_load(shadow, best, "the saved best snapshot")
        self.state = state
        self.rule.load_state_dict(rule_state, self._layers())
        self._best, self._best_unsaved = None, False
        if best is not None and best_structure is not None:
            self._best = BestSnapshot(dict(best_structure), dict(best))
        if self._report is not None:
            self._report.rewrite_metrics(self.state.history)
        self._update_probe()
        self._last_time = time.perf_counter()

    def save(self, path: str | Path) -> None:
        """Write a checkpoint atomically (safetensors + JSON; never pickle).

        Under FSDP2 call it on every rank: the full model and optimizer state is gathered,
        rank 0 writes."""
        ckpt = self.to_checkpoint()
        if not self.backend.sharded or is_rank_zero():
            save_checkpoint(path, ckpt)

    def load(self, path_or_name: str | Path) -> Decision:
        """Resume from a checkpoint: structure, weights, controller, rule, optimizer state.

        A bare name (``"latest"``, ``"best"``, ``"switch_3"``) is looked up in ``run_dir``.
        Register the optimizer (and scheduler) before loading so their state is restored.
        The file is checked and the load rehearsed on a weightless copy of the model first:
        a file that is corrupt or does not fit raises CheckpointError (ShapeMismatchError)
        and leaves the model, controller and optimizer as they were.
        """
        path = Path(path_or_name)
        if not path.suffix and self.run_dir is not None and not path.exists():
            path = self.checkpoint_path(str(path_or_name))
        barrier()  # rank 0 may still be writing the file the other ranks read
        return self._load_checkpoint(load_checkpoint(path), path)

    def _load_checkpoint(self, ckpt: Checkpoint, path: Path, rehearsed: bool = False
                         ) -> Decision:
        """Apply a loaded (header-checked) checkpoint; see :meth:`load`."""
        meta = ckpt.meta
        if "controller" not in meta:
            raise CheckpointError(f"{path} holds a model but no controller state; use "
                                  "perfora.load_model() for weights only")
        if "structure" not in meta:
            raise CheckpointError(f"{path}: structure: missing")
        state = _checked_state(meta["controller"], str(path))
        use_optimizer = self._slot.rebuildable
        if not rehearsed and not self.backend.sharded:
            rehearse_checkpoint(self.model, ckpt, str(path), self.config,
                                self._slot.recipe if use_optimizer else None,
                                self._slot.scheduler_recipe)
        self._unshard()
        fit_structure(self.model, meta["structure"], str(path))
        load_state_into(self.model, ckpt.tensors.get("model", {}), str(path))
        self.state = state
        self.state.num_dendrites = self._layer_dendrites()  # "best" may hold fewer than the run
        self.rule.load_state_dict(meta.get("rule", {}), self._layers())
        self._best, self._best_unsaved = None, False
        if "best" in ckpt.tensors:
            self._best = BestSnapshot(meta["best_structure"], ckpt.tensors["best"])
        self._rebuild_after_change()
        if self.optimizer is not None and "optimizer" in meta and not self._slot.user_owned:
            saved = join_optimizer_state(ckpt.tensors.get("optimizer", {}), meta["optimizer"])
            try:
                self.backend.load_optimizer_state(self.optimizer, self.model, saved,
                                                  meta["optimizer"])
            except (ValueError, KeyError) as exc:
                raise CheckpointError(f"{path}: the optimizer state does not fit the "
                                      f"optimizer registered now ({exc}); register the same "
                                      "optimizer class and arguments as the saved run") from exc
        if self.scheduler is not None and meta.get("scheduler") is not None:
            self.scheduler.load_state_dict(meta["scheduler"])
        if self._report is not None:
            self._report.rewrite_metrics(self.state.history)
        self._update_probe()
        self._last_time = time.perf_counter()
        return self._decision(RESTRUCTURE, f"loaded {path.name}")


def _checked_state(data: Any, source: str = "the saved perfora state") -> ControllerState:
    """A ControllerState from checked JSON (CheckpointError naming the field otherwise)."""
    try:
        return ControllerState.from_dict(validate_controller_state(data))
    except CheckpointError as exc:
        raise CheckpointError(f"{source}: {exc}") from None


def _rehearse_rule(shadow: nn.Module, config: PerforaConfig, state: Mapping[str, Any],
                   source: str) -> bool:
    """Load a rule state into a fresh rule bound to a shadow model (CheckpointError if it
    does not fit); False when the rule needs weights the shadow does not hold."""
    rule = make_rule(config.rule, config)
    rule.bind_model(shadow)
    try:
        rule.load_state_dict(state, dendritic_layers(shadow))
    except NotImplementedError:
        return False  # it read a weightless (meta) tensor: the real load will tell
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as exc:
        if "meta" in str(exc):
            return False
        raise CheckpointError(f"{source}: rule: the saved state of rule {config.rule!r} does "
                              f"not fit this model ({exc})") from exc
    return True


def rehearse_checkpoint(model: nn.Module, ckpt: Checkpoint, source: str, config: PerforaConfig,
                        optimizer: OptimizerRecipe | None = None,
                        scheduler: SchedulerRecipe | None = None,
                        activation: str | None = None) -> None:
    """Everything a controller load does, done on a weightless copy of ``model`` first.

    Raises CheckpointError (ShapeMismatchError) where the real load would fail half-way:
    the structure, the weights, the rule state, the optimizer and scheduler state, and the
    best snapshot are each fitted to the copy. Does nothing for models that cannot be
    copied (sharded ones): then the file's own checks are all that runs first."""
    meta = ckpt.meta
    shadow = shadow_copy(model)
    if shadow is None:
        return
    fit_structure(shadow, meta["structure"], source)
    if activation is not None:
        try:
            _apply_activation(dendritic_layers(shadow), activation)
        except ConversionError as exc:
            raise CheckpointError(f"{source}: {exc}") from exc
    rehearse_load(shadow, ckpt.tensors.get("model", {}), source)
    ruled = _rehearse_rule(shadow, config, meta.get("rule", {}), source)
    if optimizer is not None and ruled:  # (the trainable flags come from the rule)
        _rehearse_optimizer(shadow, ckpt, source, config, optimizer, scheduler)
    if "best" in ckpt.tensors:
        fit_structure(shadow, meta["best_structure"], f"{source} (best_structure)")
        rehearse_load(shadow, ckpt.tensors["best"], f"{source} (best snapshot)")


def _rehearse_optimizer(shadow: nn.Module, ckpt: Checkpoint, source: str,
                        config: PerforaConfig, optimizer: OptimizerRecipe,
                        scheduler: SchedulerRecipe | None) -> None:
    """Load the saved optimizer and scheduler state into fresh ones over the shadow model,
    then take one step with zero gradients (on the meta device: no memory, no values).

    Where a fresh optimizer can step on the meta device (Adam, SGD...), a saved state that
    would break the first real step (a missing key, a moment of another shape or dtype)
    is refused now; the others get the checks ``load_state_dict`` does."""
    meta = ckpt.meta

    def refuse(exc: Exception, what: str = "optimizer") -> CheckpointError:
        return CheckpointError(f"{source}: the {what} state does not fit the {what} "
                               f"registered now ({exc}); register the same {what} class and "
                               "arguments as the saved run")

    def fresh() -> Any:
        try:
            return optimizer.build(shadow)
        except Exception:  # e.g. fused=True wants real devices: the real build will say
            return None

    for p in shadow.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    reference = fresh()
    if reference is None:
        return
    can_step = _meta_step(reference)
    opt = fresh()
    if "optimizer" in meta:
        saved = join_optimizer_state(ckpt.tensors.get("optimizer", {}), meta["optimizer"])
        saved_ids = [i for group in saved["param_groups"] for i in group["params"]]
        params = [p for group in opt.param_groups for p in group["params"]]
        real = {i for i, p in zip(saved_ids, params, strict=False) if p.device.type != "meta"}
        saved["state"] = {idx: {k: _weightless(v, idx in real) for k, v in entry.items()}
                          for idx, entry in saved["state"].items()}
        try:
            for i, (group, own) in enumerate(zip(saved["param_groups"], opt.param_groups,
                                                 strict=False)):
                check_like({k: v for k, v in group.items() if k != "params"},
                           {k: v for k, v in own.items() if k != "params"},
                           f"optimizer.param_groups[{i}]", strict_keys=False)
            _check_hyperparameters(opt, saved["param_groups"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt.load_state_dict(saved)
        except (ValueError, KeyError, TypeError, CheckpointError) as exc:
            raise refuse(exc) from exc
        for i, (group, own) in enumerate(zip(opt.param_groups, reference.param_groups,
                                             strict=True)):
            missing = sorted(set(own) - set(group))
            if missing:
                raise refuse(CheckpointError(f"optimizer.param_groups[{i}].{missing[0]}: "
                                             "missing"))
        if can_step:
            try:
                _meta_step(opt, strict=True)
            except Exception as exc:
                raise refuse(exc) from exc
    if scheduler is None or meta.get("scheduler") is None:
        return
    try:
        sched = scheduler.build(opt)
    except Exception:  # the real build raises the same error, with the real model
        return
    try:
        check_like(meta["scheduler"], sched.state_dict(), "scheduler")
        sched.load_state_dict(copy.deepcopy(meta["scheduler"]))
        if can_step:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                step_scheduler(sched, 0.0, config.maximize)
    except Exception as exc:
        raise refuse(exc, "scheduler") from exc


_DEVICE_FLAGS = ("fused", "foreach", "capturable", "differentiable")


def _check_hyperparameters(opt: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> None:
    """Each saved param group's hyperparameters pass the optimizer's own constructor checks
    (Adam: 0 <= betas < 1, eps >= 0...), which ``load_state_dict`` skips."""
    keys = set(opt.defaults) - set(_DEVICE_FLAGS)

    def build(group: Mapping[str, Any]) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            type(opt)([torch.empty(1, device="meta", requires_grad=True)],
                      **{k: v for k, v in group.items() if k in keys})

    try:
        build(opt.param_groups[0])
    except Exception:  # this optimizer cannot be built that way: load_state_dict's checks
        return
    for i, group in enumerate(groups):
        try:
            build(group)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise CheckpointError(f"optimizer.param_groups[{i}]: {exc}") from exc


def _weightless(value: Any, real: bool) -> Any:
    """A saved optimizer value for the rehearsal: tensors as meta tensors (no memory), except
    one-element ones (step counts) and those of parameters the shadow holds for real (``v``),
    which are cloned, since a rehearsal step changes them in place."""
    if not isinstance(value, torch.Tensor):
        return value
    if real or value.numel() <= 1:
        return value.clone()
    return torch.empty_like(value, device="meta")


def _meta_step(opt: torch.optim.Optimizer, strict: bool = False) -> bool:
    """One step of an optimizer over meta parameters; False where that cannot run at all."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt.step()
    except Exception:
        if strict:
            raise
        return False
    return True


def _apply_activation(layers: Mapping[str, Any], activation: str | None) -> None:
    """Give every wrapped layer the configured dendrite nonlinearity (None: keep theirs)."""
    if activation is None:
        return
    for path, layer in layers.items():
        if layer.activation == activation:
            continue
        if layer.num_dendrites:
            raise PerforationError(f"layer {path!r} already holds {layer.activation} dendrites; "
                                   f"the setting activation={activation!r} cannot change them "
                                   "(leave activation unset to keep the model's)")
        layer.activation = activation


def _jsonable_or_none(state: Mapping[str, Any]) -> dict[str, Any] | None:
    import json

    try:
        json.dumps(state)
        return dict(state)
    except TypeError:
        warnings.warn("the scheduler's state is not JSON-serializable and was not saved; "
                      "it restarts from its initial state on resume", stacklevel=3)
        return None
