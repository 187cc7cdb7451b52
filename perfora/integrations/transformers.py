"""Growth inside a Hugging Face ``Trainer``: the :class:`DendriteGrowthCallback`.

::

    trainer = Trainer(model=model, args=args, train_dataset=..., eval_dataset=...,
                      compute_metrics=...)
    growth = DendriteGrowthCallback(monitor="eval_accuracy", patience=3, max_dendrites=2)
    growth.bind(trainer)          # perforates trainer.model now, before the optimizer exists
    trainer.train()               # or trainer.train(resume_from_checkpoint=True)

After every evaluation during ``train`` the monitored metric goes to a
:class:`~perfora.GrowthController` (averaged over ranks). When dendrites are added, the grown
model gets a new DistributedDataParallel wrapper (``accelerator.prepare``) and a new optimizer
and LR scheduler built by the Trainer's own ``create_optimizer`` and ``create_scheduler``; the
scheduler keeps its position. Completion restores the best model and stops training. Every
Trainer checkpoint gets ``perfora.safetensors`` (structure, scores, best model); a resumed run
gives the model its saved dendrites before the Trainer loads the weights.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from ..checkpoint.weight_files import folder_shapes
from ..config import PerforaConfig
from ..errors import CheckpointError, ConfigError, OrderError, PerforaError, require_bool
from ..growth import GrowthController
from ..growth.state import CONTINUE
from ..nn.layers import unwrap_model
from ._common import (
    CONTROLLER_FILE,
    GrowthCallback,
    apply_controller_file,
    check_mode,
    check_structure_fits_weights,
    did_you_mean,
    read_controller_file,
    read_score,
    save_controller_file,
)
from .accelerate import _forget
from .hf_weights import load_grown_pretrained

try:
    from transformers import (
        EarlyStoppingCallback,
        Trainer,
        TrainerCallback,
        TrainerControl,
        TrainerState,
        TrainingArguments,
    )
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
    from transformers.utils import (
        SAFE_WEIGHTS_INDEX_NAME,
        SAFE_WEIGHTS_NAME,
        WEIGHTS_INDEX_NAME,
        WEIGHTS_NAME,
    )
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError("perfora.integrations.transformers needs Hugging Face transformers: "
                      "pip install transformers") from exc

__all__ = ["DendriteGrowthCallback", "CONTROLLER_FILE", "load_grown_pretrained"]


class DendriteGrowthCallback(GrowthCallback, TrainerCallback):
    """Grow dendrites during ``Trainer.train`` when the monitored eval metric plateaus.

    ``monitor`` is a key of the evaluation metrics (``"eval_accuracy"``; the ``eval_``
    prefix may be left out); ``None`` takes ``args.metric_for_best_model`` and
    ``args.greater_is_better``, else ``"eval_loss"``. ``mode`` (``"min"``/``"max"``)
    defaults as the Trainer does: ``"min"`` for a name ending in ``loss``, else ``"max"``.
    ``patience`` counts evaluations (``patience``, ``max_dendrites`` and ``mode`` left out
    take what ``config`` sets, else 10, 3 and the Trainer's conventions); ``module`` is the
    dotted path of the submodule to perforate (``None``: the whole model);
    ``perforate_kwargs`` go to :func:`perfora.perforate`; ``config`` or keyword ``settings`` are
    :class:`~perfora.PerforaConfig` fields. Run files go to ``run_dir`` (default
    ``<output_dir>/perfora_runs``; ``write_files=False``: none). A run whose epochs or
    ``max_steps`` run out before growth completes ends with its best model (the best
    snapshot's structure and weights, as completion does), unless
    ``restore_best_at_end=False`` (then it ends with its last one). After each of those
    evaluations ``perfora/dendrites``, ``perfora/neuron_steps``, ``perfora/phase`` and
    ``perfora/params`` go to ``trainer.log`` (``log_metrics=False``: not), and each growth
    step, rewind, phase change (``rule='correlation'``) and the completion is printed with
    its reason on the main process (``verbose=False``: not). Call :meth:`bind` with the
    Trainer before ``train``.
    """

    callback_name = "DendriteGrowthCallback"
    model_noun = "model"

    def __init__(self, monitor: str | None = None, mode: str | None = None,
                 patience: int | None = None, max_dendrites: int | None = None, *,
                 module: str | None = None,
                 config: PerforaConfig | Mapping[str, Any] | None = None,
                 perforate_kwargs: Mapping[str, Any] | None = None,
                 run_dir: str | os.PathLike | None = None, write_files: bool = True,
                 restore_best_at_end: bool = True, log_metrics: bool = True,
                 verbose: bool = True, **settings: Any) -> None:
        if mode is not None:
            check_mode(mode)
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise ConfigError(f"monitor must be the name of an eval metric, got {monitor!r}")
        self.monitor, self.mode = monitor, mode
        self._init_growth(patience=patience, max_dendrites=max_dendrites, module=module,
                          config=config, perforate_kwargs=perforate_kwargs, settings=settings)
        self.mode = self.config_mode(mode)
        self.growth_config(self.mode or "min")  # invalid settings fail here, not at bind
        self.config: PerforaConfig | None = None
        self.run_dir, self.write_files = run_dir, require_bool(write_files, "write_files")
        self.restore_best_at_end = require_bool(restore_best_at_end, "restore_best_at_end")
        self.log_metrics = require_bool(log_metrics, "log_metrics")
        self.verbose = require_bool(verbose, "verbose")
        self.trainer: Trainer | None = None
        self._round_metrics: dict[str, Any] = {}  # the metrics of this round of evaluations
        self._found_this_round = False

    # ------------------------------------------------------------------ binding
    def bind(self, trainer: Trainer) -> DendriteGrowthCallback:
        """Attach to ``trainer``: perforate its model, create the controller, add this callback.

        Call it after building the Trainer and before ``train``: the optimizer is created in
        ``train`` and must cover the dendritic layers. It also routes the training loop to
        the newest DDP wrapper and restores the dendrite structure on resume (this Trainer
        instance only)."""
        if self.trainer is not None and self.trainer is not trainer:
            raise OrderError("this DendriteGrowthCallback is already bound to another Trainer; "
                             "create one callback per Trainer")
        if self.trainer is trainer:
            return self
        _check_trainer(trainer)
        if any(isinstance(c, DendriteGrowthCallback) and c.trainer is trainer
               for c in trainer.callback_handler.callbacks):
            raise OrderError("this Trainer already has a bound DendriteGrowthCallback: two "
                             "would each grow the model and rebuild its optimizer; use one "
                             "callback per Trainer")
        self.monitor, self.mode = _resolve_monitor(self.monitor, self.mode, trainer.args)
        self.config = self.growth_config(self.mode)
        target = self._perforate_target(trainer.model, self.config)
        run_dir = self.run_dir if self.run_dir is not None else \
            Path(trainer.args.output_dir) / "perfora_runs"
        self.controller = GrowthController(target, self.config, run_dir=run_dir,
                                           write_files=self.write_files)
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        _route_training_step(trainer)
        self._wrap_train(trainer)
        return self

    def target(self, model: nn.Module) -> nn.Module:
        """The module that grows: ``model`` (unwrapped) itself or its ``module`` submodule."""
        return super().target(unwrap_model(model))

    def _wrap_train(self, trainer: Trainer) -> None:
        """Make ``trainer.train(resume_from_checkpoint=...)`` restore the structure first."""
        train = trainer.train

        def train_with_structure(resume_from_checkpoint: str | bool | None = None,
                                 *args: Any, **kwargs: Any) -> Any:
            folder = resume_from_checkpoint
            if folder is True:
                folder = get_last_checkpoint(trainer.args.output_dir)
            if isinstance(folder, str | os.PathLike) and folder:
                self.restore(folder)
            return train(resume_from_checkpoint, *args, **kwargs)

        trainer.train = train_with_structure  # type: ignore[method-assign]

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        if self.trainer is None:
            raise OrderError("DendriteGrowthCallback was not bound to the Trainer: call "
                             "growth.bind(trainer) after creating the Trainer and before "
                             "trainer.train()")
        self._round_metrics, self._found_this_round = {}, False
        self._check_optimizer_covers_model()
        self._warn_if_early_stopping_comes_first()

    def _warn_if_early_stopping_comes_first(self) -> None:
        """An EarlyStoppingCallback as patient as growth ends the run at the plateau that
        would have grown the model."""
        assert self.trainer is not None and self.config is not None
        patience = self.config.n_epochs_to_switch
        for callback in self.trainer.callback_handler.callbacks:
            if isinstance(callback, EarlyStoppingCallback) and \
                    callback.early_stopping_patience <= patience:
                warnings.warn(f"EarlyStoppingCallback(early_stopping_patience="
                              f"{callback.early_stopping_patience}) stops training at the "
                              f"plateau where DendriteGrowthCallback (patience {patience}) "
                              "would grow the model, so nothing may grow: give it more "
                              "patience than the growth callback, or leave it out (growth "
                              "completes and stops training itself)", UserWarning, stacklevel=2)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, metrics: Mapping[str, float] | None = None,
                    **kwargs: Any) -> None:
        trainer, ctl = self.trainer, self.controller
        if trainer is None or ctl is None or ctl.completed or not trainer.is_in_train:
            return
        score = self._read_monitor(metrics or {})
        if score is None:
            return
        self._found_this_round = True
        optimizer = trainer.optimizer
        decision = self._step(score, trainer.model, getattr(optimizer, "optimizer", optimizer))
        if decision.action != CONTINUE:
            self.rebuild(trainer)
            if self.verbose and state.is_world_process_zero:  # beside the Trainer's progress
                tqdm.write(f"DendriteGrowthCallback: epoch {state.epoch:g}: {decision.reason}")
        if self.log_metrics:  # to the Trainer's log history and its reporting integrations
            trainer.log(self.growth_metrics(decision))
        if decision.complete:
            control.should_training_stop = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if self.controller is None or not args.should_save:
            return
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if not folder.is_dir():
            warnings.warn(f"DendriteGrowthCallback: no checkpoint folder {folder} to save "
                          "perfora's state into; a resume from it will not have the dendrites",
                          UserWarning, stacklevel=2)
            return
        self.save(folder / CONTROLLER_FILE)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        trainer, ctl = self.trainer, self.controller
        if self.restore_best_at_end and trainer is not None and ctl is not None and \
                not ctl.completed and ctl.best_snapshot is not None:
            ctl.restore_best()  # the epochs or max_steps ran out first: end with the best
            self.rebuild(trainer)
            if self.verbose and state.is_world_process_zero:
                tqdm.write(f"DendriteGrowthCallback: end of training: restored the best model "
                           f"(epoch {ctl.state.best_epoch} of the run, {self.monitor} "
                           f"{ctl.best_score:g}, {ctl.parameter_count()} parameters, "
                           f"{ctl.num_dendrites} dendrite set(s))")
        self._finish()
        self._check_round()  # after the run files are written: nothing is lost

    # ------------------------------------------------------------------ growth
    def rebuild(self, trainer: Trainer) -> None:
        """New DDP wrapper, optimizer and LR scheduler over the grown model.

        The optimizer and scheduler come from the Trainer's ``create_optimizer`` and
        ``create_scheduler``; the scheduler takes the old one's state (its step count) and
        the new optimizer the old learning rates (and, after a neuron step, the old
        moments)."""
        old_optimizer, old_scheduler = trainer.optimizer, trainer.lr_scheduler
        old_lrs = [g["lr"] for g in old_optimizer.param_groups] if old_optimizer else None
        scheduler_state = old_scheduler.state_dict() if old_scheduler is not None else None
        trainer.optimizer = trainer.lr_scheduler = None
        optimizer = trainer.create_optimizer()
        inner = unwrap_model(trainer.model)
        model_wrapped, optimizer = self._prepare(trainer, inner, optimizer)
        trainer.optimizer, trainer.model_wrapped = optimizer, model_wrapped
        max_steps = trainer.state.max_steps
        scheduler = trainer.create_scheduler(num_training_steps=max_steps, optimizer=optimizer)
        if scheduler_state is not None:
            scheduler.load_state_dict(scheduler_state)
        groups = optimizer.param_groups
        lrs = old_lrs if old_lrs is not None and len(old_lrs) == len(groups) else \
            _last_lrs(scheduler, len(groups))
        for group, lr in zip(groups, lrs or [], strict=False):
            group["lr"] = lr
        if self.controller is not None:  # after a neuron step: the moments go on
            self.controller.carry_optimizer_state(getattr(optimizer, "optimizer", optimizer))
        handler = trainer.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = \
            trainer.model, trainer.optimizer, trainer.lr_scheduler

    def _prepare(self, trainer: Trainer, inner: nn.Module,
                 optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        """``accelerator.prepare`` of the grown model (a new DDP wrapper) and the optimizer;
        the accelerator forgets the replaced ones."""
        accelerator = trainer.accelerator
        if isinstance(trainer.model_wrapped, nn.DataParallel):  # replicates every forward
            _forget(accelerator, inner)
            return trainer.model_wrapped, accelerator.prepare(optimizer)
        _forget(accelerator, inner)
        model, prepared = accelerator.prepare(inner, optimizer)
        return model, prepared

    def _check_optimizer_covers_model(self) -> None:
        """The optimizer must hold the dendritic layers' parameters (created after bind)."""
        trainer = self.trainer
        assert trainer is not None and self.controller is not None
        optimizer = trainer.optimizer
        if optimizer is None:
            return
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [n for n, p in self.target(trainer.model).named_parameters()
                   if p.requires_grad and id(p) not in held]
        if missing:
            raise OrderError(f"the Trainer's optimizer does not hold {missing[:3]} (of "
                             f"{len(missing)} trainable parameters): it was created before "
                             "growth.bind(trainer) perforated the model")

    def _read_monitor(self, metrics: Mapping[str, Any]) -> float | None:
        assert self.monitor is not None
        self._round_metrics.update(metrics)  # each eval dataset of a round reports apart
        return read_score(metrics, self.monitor, f"eval_{self.monitor}")

    def _check_round(self) -> None:
        """After a round of evaluations (one per eval dataset), refuse to train on when none
        of them reported the monitored metric: nothing could grow (the Trainer refuses a
        ``metric_for_best_model`` it is not given in the same way)."""
        seen, found = self._round_metrics, self._found_this_round
        self._round_metrics, self._found_this_round = {}, False
        if not seen or found:
            return
        raise ConfigError(
            f"DendriteGrowthCallback(monitor={self.monitor!r}) found no such metric after "
            f"evaluation{did_you_mean(self.monitor, seen)}; the metrics are "
            f"{sorted(seen)}. Nothing can grow unless it is reported: return it from "
            "compute_metrics (its keys get the eval_ prefix) or pass "
            "monitor=<one of them>")

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        self._check_round()

    # ------------------------------------------------------------------ state
    def save(self, path: str | os.PathLike) -> None:
        """Write the controller state, the structure and the best snapshot (no weights:
        the Trainer saves those) to one safetensors file."""
        if self.controller is None:
            raise OrderError("save() before bind(trainer)")
        save_controller_file(self.controller, path)

    def restore(self, folder: str | os.PathLike) -> None:
        """Give the model the dendrites saved in a Trainer checkpoint folder and restore the
        controller (called by ``train(resume_from_checkpoint=...)``, before the weights load)."""
        if self.controller is None:
            raise OrderError("restore() before bind(trainer)")
        path = Path(folder) / CONTROLLER_FILE
        if not path.is_file():
            raise CheckpointError(f"{folder} has no {CONTROLLER_FILE}: it was not written "
                                  "by a Trainer with a bound DendriteGrowthCallback, so its "
                                  "weights may not fit the perforated model")
        ckpt = read_controller_file(path)
        assert self.trainer is not None
        shapes = _weight_shapes(Path(folder))
        check_structure_fits_weights(unwrap_model(self.trainer.model), self.module_path,
                                     ckpt.meta["structure"], shapes, str(folder))
        apply_controller_file(self.controller, ckpt)


def _check_trainer(trainer: Any) -> None:
    """Refuse setups whose optimizer or wrapper perfora cannot rebuild."""
    if not isinstance(trainer, Trainer):
        raise ConfigError(f"bind() needs a transformers.Trainer, got {type(trainer).__name__}")
    if getattr(trainer, "is_deepspeed_enabled", False) or \
            getattr(trainer, "is_fsdp_enabled", False):
        raise PerforaError("DendriteGrowthCallback supports single-device and DDP Trainer runs; "
                           "DeepSpeed and FSDP shard the parameters, so perfora cannot add "
                           "dendrites in place under them (use the Lightning callback for FSDP)")
    strategy = getattr(trainer.args, "eval_strategy", None) or \
        getattr(trainer.args, "evaluation_strategy", "no")
    if str(getattr(strategy, "value", strategy)) == "no":
        raise ConfigError('TrainingArguments(eval_strategy="no") never evaluates, so the '
                          "growth callback gets no score and nothing can grow: set "
                          'eval_strategy="epoch" and metric_for_best_model (the metric to '
                          "monitor), and give the Trainer an eval_dataset")
    if getattr(trainer, "model_init", None) is not None:
        raise ConfigError("Trainer(model_init=...) builds a new model at every train() (for "
                          "hyperparameter_search), which would replace the model bind() "
                          "perforated with an unperforated one: build the model yourself and "
                          "pass Trainer(model=model_init())")
    if getattr(trainer.args, "load_best_model_at_end", False):
        raise ConfigError("TrainingArguments(load_best_model_at_end=True) would load a Trainer "
                          "checkpoint at the end, possibly of another dendrite structure, over "
                          "the best model perfora restores itself (at completion, and when "
                          "the epochs or max_steps run out first); set it to False, and keep "
                          "DendriteGrowthCallback(restore_best_at_end=True), the default")
    if trainer.optimizer is not None or trainer.lr_scheduler is not None:
        raise ConfigError("Trainer(optimizers=(...)) holds an optimizer built before perfora "
                          "perforated the model, and perfora rebuilds the optimizer after every "
                          "growth step with trainer.create_optimizer(): pass "
                          "optimizer_cls_and_kwargs=(cls, kwargs) or TrainingArguments(optim=..., "
                          "lr_scheduler_type=...) instead")


def _weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Keys and shapes of the model weights the Trainer saved in ``folder`` (headers only)."""
    for single, index in ((SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME),
                          (WEIGHTS_NAME, WEIGHTS_INDEX_NAME)):
        shapes = folder_shapes(folder, single, index)
        if shapes is not None:
            return shapes
    raise CheckpointError(f"{folder} has no model weights ({SAFE_WEIGHTS_NAME} or "
                          f"{WEIGHTS_NAME}, or their index): not a Trainer checkpoint folder")


def _resolve_monitor(monitor: str | None, mode: str | None,
                     args: TrainingArguments) -> tuple[str, str]:
    """(monitor, mode) following the Trainer's metric_for_best_model conventions."""
    best = getattr(args, "metric_for_best_model", None)
    if monitor is None:
        monitor = best or "eval_loss"
    if not monitor.startswith("eval_"):
        monitor = f"eval_{monitor}"
    if mode is None:
        if best is not None and monitor in (best, f"eval_{best}") and \
                args.greater_is_better is not None:
            mode = "max" if args.greater_is_better else "min"
        else:
            mode = "min" if monitor.endswith("loss") else "max"
    return monitor, mode


def _last_lrs(scheduler: Any, count: int) -> list[float] | None:
    lrs = getattr(scheduler, "_last_lr", None)
    return list(lrs) if lrs is not None and len(lrs) == count else None


def _route_training_step(trainer: Trainer) -> None:
    """Send the training loop's steps through ``trainer.model_wrapped``.

    ``Trainer._inner_training_loop`` keeps the wrapper of the start of training in a local
    variable and passes it to ``training_step``; after a growth step that wrapper's gradient
    buckets miss the dendrites, so each step is redirected to the newest wrapper (inside its
    ``no_sync`` when the loop asked the old one not to synchronize)."""
    step = trainer.training_step

    def training_step(model: nn.Module, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        current = trainer.model_wrapped
        if model is current or unwrap_model(model) is not unwrap_model(current):
            return step(model, inputs, *args, **kwargs)
        if not getattr(model, "require_backward_grad_sync", True) and \
                hasattr(current, "no_sync"):
            with current.no_sync():
                return step(current, inputs, *args, **kwargs)
        return step(current, inputs, *args, **kwargs)

    trainer.training_step = training_step  # type: ignore[method-assign]
