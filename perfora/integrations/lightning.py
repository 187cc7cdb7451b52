"""PyTorch Lightning integration: the :class:`DendriteGrowth` callback.

The callback perforates the LightningModule (or one of its submodules) at setup, feeds the
monitored metric to a :class:`~perfora.GrowthController` at the end of every validation,
and after each restructure re-wraps the model under the active strategy and rebuilds the
optimizers and schedulers from the user's ``configure_optimizers`` (DDP, FSDP2 and FSDP1
through perfora's sharding helpers, DeepSpeed ZeRO 0-2). Growth completion
restores the best model and stops the fit. Lightning is an optional dependency
(``pip install "perfora[lightning]"``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import PerforaConfig
from ..errors import ConfigError, PerforaError, require_bool
from ..growth import GrowthController
from ..growth.state import CONTINUE, Decision
from ..nn.layers import dendritic_layers
from ..nn.perforation import layer_specs
from ..parallel.sharded_state import is_fsdp1
from ._common import (
    PHASE_CODES,
    GrowthCallback,
    check_mode,
    controller_state,
    dendrite_counts,
    did_you_mean,
    read_score,
)
from .lightning_restore import (
    checkpoint_structure,
    is_installed,
    mark_installed,
    reshape_in_place,
    reshaped,
)
from .lightning_support import (
    load_grown_checkpoint,
    prime_optimizer_state,
    refuse_fused_neurons_when_spawned,
    reinitialize_deepspeed,
    saved_callback_state,
    strategy_schedulers,
    zero_stage,
)
from .schedule_carry import capture_schedule, restore_schedule

try:  # the unified package first, then the standalone one
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, EarlyStopping
    from lightning.pytorch.strategies import (
        DDPStrategy,
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
    )
    from lightning.pytorch.strategies.launchers.multiprocessing import (
        _MultiProcessingLauncher,
    )
    from lightning.pytorch.utilities import rank_zero_info
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        import pytorch_lightning as pl
        from pytorch_lightning.callbacks import Callback, EarlyStopping
        from pytorch_lightning.strategies import (
            DDPStrategy,
            DeepSpeedStrategy,
            FSDPStrategy,
            ModelParallelStrategy,
        )
        from pytorch_lightning.strategies.launchers.multiprocessing import (
            _MultiProcessingLauncher,
        )
        from pytorch_lightning.utilities import rank_zero_info
    except ImportError as exc:
        raise ImportError('perfora.integrations.lightning needs PyTorch Lightning: pip install '
                          '"perfora[lightning]" (or lightning>=2.2)') from exc

__all__ = ["DendriteGrowth", "PHASE_CODES", "load_grown_checkpoint"]

LOWER_IS_BETTER = re.compile(r"loss|err|mse|mae|nll|perplex|ppl", re.I)
HIGHER_IS_BETTER = re.compile(r"acc|f1|auc|precision|recall|bleu", re.I)
"""Metric names whose direction is clear: a loss is minimized, an accuracy maximized."""


class DendriteGrowth(GrowthCallback, Callback):
    """Grow dendrites during ``trainer.fit`` when the monitored metric plateaus.

    ``monitor``/``mode``/``patience`` work as in ``EarlyStopping``; ``max_dendrites`` caps
    the dendrite sets. ``patience``, ``max_dendrites`` and ``mode`` left out take what
    ``config`` sets, else 10, 3 and ``"min"``. ``module`` is the attribute path of the
    submodule to perforate (``None``: the whole LightningModule). ``config`` or keyword
    ``settings`` are any :class:`~perfora.PerforaConfig` fields; ``perforate_kwargs`` go to
    :func:`perfora.perforate`. Run files (metrics.csv, history.png) go to ``run_dir``
    (default: ``<trainer.default_root_dir>/perfora_runs``); Lightning's own checkpoints carry the
    dendrites, so perfora writes no model files of its own unless ``save_checkpoints=True``.
    Each growth step, rewind, phase change (``rule='correlation'``) and the completion is
    announced on rank 0 with its reason (Lightning's info log; ``verbose=False``: not).
    """

    callback_name = "DendriteGrowth"
    model_noun = "LightningModule"

    def __init__(self, monitor: str = "val_loss", mode: str | None = None,
                 patience: int | None = None, max_dendrites: int | None = None, *,
                 module: str | None = None,
                 config: PerforaConfig | Mapping[str, Any] | None = None, rule: str | None = None,
                 perforate_kwargs: Mapping[str, Any] | None = None,
                 run_dir: str | None = None, log_metrics: bool = True, verbose: bool = True,
                 **settings: Any) -> None:
        super().__init__()
        if mode is not None:
            check_mode(mode)
        if not isinstance(monitor, str) or not monitor:
            raise ConfigError(f"monitor must be the name of a logged metric, got {monitor!r}")
        if rule is not None:
            settings = {**settings, "rule": rule}
        self._init_growth(patience=patience, max_dendrites=max_dendrites, module=module,
                          config=config, perforate_kwargs=perforate_kwargs, settings=settings)
        mode = self.config_mode(mode) or "min"
        self.config = self.growth_config(mode)
        self.monitor, self.mode = monitor, mode
        self.run_dir = run_dir
        self.log_metrics = require_bool(log_metrics, "log_metrics")
        self.verbose = require_bool(verbose, "verbose")
        self._pl_module: nn.Module | None = None
        self._pending: dict[str, Any] | None = None
        self._validations = 0  # validation ends seen in this fit (sanity check excluded)
        self._warned_no_metric = False
        self._stage = "fit"  # the Trainer stage setup last saw (fit, validate, test, predict)

    # ------------------------------------------------------------------ the model
    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    def _set_target(self, pl_module: nn.Module, new: nn.Module) -> None:
        if self.module_path is None:
            if new is not pl_module:
                raise PerforaError("the LightningModule itself cannot be replaced; give "
                                   "DendriteGrowth(module=...) the submodule to grow")
            return
        parent_path, _, name = self.module_path.rpartition(".")
        parent = pl_module.get_submodule(parent_path) if parent_path else pl_module
        setattr(parent, name, new)

    def prepare(self, pl_module: nn.Module) -> nn.Module:
        """Perforate the model now (idempotent). Needed before ``fit`` only for ddp_spawn."""
        self._perforate_target(pl_module, self.config)
        return pl_module

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stage = stage
        if stage != "fit":  # test/validate/predict(ckpt_path=...): the saved structure first
            if self._sharded(trainer.strategy):
                self.prepare(pl_module)  # configure_model shards a perforated model
                self._regrow_before_checkpoint_load(trainer, pl_module)
            else:
                self._take_saved_structure_on_load(trainer, pl_module)
            return
        if sum(isinstance(c, DendriteGrowth) for c in trainer.callbacks) > 1:
            raise ConfigError("the Trainer has more than one DendriteGrowth callback: each "
                              "would grow the model on its own; use one per Trainer")
        self._validations, self._warned_no_metric = 0, False
        if trainer.is_global_zero:
            self._warn_if_direction_looks_wrong()
            warn_if_early_stopping_comes_first(trainer.callbacks, self.config.n_epochs_to_switch)
        strategy = trainer.strategy
        self._check_strategy(strategy)
        grown_here = not dendritic_layers(self.target(pl_module))
        if grown_here and isinstance(getattr(strategy, "launcher", None),
                                     _MultiProcessingLauncher):
            raise PerforaError(
                f"strategy {type(strategy).__name__} with start method "
                f"{getattr(strategy, '_start_method', '?')!r} copies the trained weights back "
                "to the launching process with load_state_dict(strict=False), which drops "
                "layers that process does not have. Perforate the model there before fit: "
                "growth = DendriteGrowth(...); growth.prepare(model); trainer.fit(model)")
        self.prepare(pl_module)
        if isinstance(getattr(strategy, "launcher", None), _MultiProcessingLauncher):
            refuse_fused_neurons_when_spawned(
                self.target(pl_module), self.config, f"{type(strategy).__name__} with start "
                f"method {getattr(strategy, '_start_method', '?')!r}")
        self._pl_module = pl_module
        self.controller = None
        if self._sharded(strategy):
            self._regrow_before_checkpoint_load(trainer, pl_module)
        else:
            self._take_saved_structure_on_load(trainer, pl_module)

    def _take_saved_structure_on_load(self, trainer: pl.Trainer,
                                      pl_module: pl.LightningModule) -> None:
        """Before Lightning loads a checkpoint's weights (``ckpt_path=``), give the model the
        dendrites and neuron widths saved with them: a checkpoint from before a growth step
        (``ckpt_path="best"``) then loads into the grown model, and any checkpoint into a
        freshly built one. (Sharded strategies: :meth:`_regrow_before_checkpoint_load`.)"""
        strategy = trainer.strategy
        load = strategy.load_model_state_dict
        if is_installed(load):
            return  # installed by an earlier stage of this Trainer

        def load_model_state_dict(checkpoint: Mapping[str, Any], *args: Any,
                                  **kwargs: Any) -> Any:
            structure = checkpoint_structure(checkpoint.get("callbacks"), self.state_key,
                                             self.module_path)
            if structure is not None:
                reshape_in_place(self.target(pl_module), structure)
            return load(checkpoint, *args, **kwargs)

        strategy.load_model_state_dict = mark_installed(load_model_state_dict)

    def _regrow_before_checkpoint_load(self, trainer: pl.Trainer,
                                       pl_module: pl.LightningModule) -> None:
        """ModelParallelStrategy, FSDP1 and DeepSpeed restore a checkpoint into the wrapped
        model, after setup: give the model the saved structure first (re-sharded or in a new
        engine), then let the strategy load. A fit's controller reshapes it (the growth run
        resumes from there); test/validate/predict reshape it without the controller."""
        strategy = trainer.strategy
        load = strategy.load_checkpoint
        if is_installed(load):
            return  # installed by an earlier stage of this Trainer

        def load_checkpoint(checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
            saved = saved_callback_state(Path(strategy.broadcast(checkpoint_path)),
                                         self.state_key)
            structure = checkpoint_structure({self.state_key: saved} if saved else None,
                                             self.state_key, self.module_path)
            if structure and self._stage == "fit" and self.controller is not None:
                self._set_target(pl_module, self.controller.match_structure(structure))
                self._rebuild(trainer)
            elif structure and self._stage != "fit":
                target = self.target(pl_module)
                if layer_specs(target) != structure:
                    self._set_target(pl_module, reshaped(target, structure))
                    # a fit's optimizers hold parameters the model no longer has (a
                    # later fit builds its own)
                    strategy.optimizers = []
                    if isinstance(strategy, DeepSpeedStrategy):
                        reinitialize_deepspeed(strategy, train=False)
            return load(checkpoint_path, *args, **kwargs)

        strategy.load_checkpoint = mark_installed(load_checkpoint)

    @staticmethod
    def _sharded(strategy: Any) -> bool:
        """Strategies that load a checkpoint's weights in ``load_checkpoint``."""
        return isinstance(strategy, ModelParallelStrategy | DeepSpeedStrategy | FSDPStrategy)

    def _check_strategy(self, strategy: Any) -> None:
        if isinstance(strategy, FSDPStrategy) and (
                not strategy.kwargs.get("use_orig_params") or self.module_path is None):
            raise PerforaError(
                "strategy='fsdp' (FSDP1) flattens the whole LightningModule, so perfora "
                "cannot add dendrites in place. Use strategy=FSDPStrategy(use_orig_params=True),"
                " wrap the submodule in configure_model with self.<module> = "
                "perfora.wrap_fsdp1(self.<module>, device_id=self.trainer.strategy."
                "root_device) and pass DendriteGrowth(module='<module>'); or use FSDP2 "
                "(ModelParallelStrategy with perfora.shard_fsdp2)")
        if isinstance(strategy, DeepSpeedStrategy) and zero_stage(strategy) == 3:
            raise PerforaError(
                "Lightning's DeepSpeedStrategy with ZeRO stage 3 builds the engine itself, "
                "so perfora cannot rebuild it after adding dendrites. For ZeRO-3 growth train "
                "in a plain loop with perfora.wrap_deepspeed(model, config, "
                "optimizer=..., optimizer_args=...), which rebuilds the engine and grows one "
                "layer at a time; in Lightning use ZeRO stage 1 or 2 "
                "(strategy='deepspeed_stage_2'), or FSDP2 through ModelParallelStrategy")
        if isinstance(strategy, ModelParallelStrategy) and self.module_path is None:
            raise ConfigError("under ModelParallelStrategy give DendriteGrowth(module=...) the "
                              "submodule you shard with perfora.shard_fsdp2 in configure_model")

    def _ensure_controller(self, trainer: pl.Trainer, pl_module: nn.Module) -> GrowthController:
        """Create the controller once the model has its final (possibly sharded) form."""
        if self.controller is None:
            target = self.target(pl_module)
            if isinstance(trainer.strategy, FSDPStrategy) and not is_fsdp1(target):
                raise PerforaError(
                    f"under strategy='fsdp' wrap the grown submodule in configure_model: "
                    f"self.{self.module_path} = perfora.wrap_fsdp1(self.{self.module_path}, "
                    "device_id=self.trainer.strategy.root_device)")
            run_dir = self.run_dir
            if run_dir is None:
                run_dir = f"{trainer.default_root_dir}/perfora_runs"  # not "perfora": a folder
                # of that name in the working directory would shadow the package
            self.controller = GrowthController(self.target(pl_module), self.config,
                                               run_dir=run_dir)
            if self._pending is not None:
                self._restore(self._pending)
                self._pending = None
        return self.controller

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ensure_controller(trainer, pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.controller is None or trainer.state.fn != "fit":
            return
        self._validations += 1  # also after completion: the metric was there to read
        if self.controller.completed:
            return
        score = self._read_monitor(trainer)
        decision = self._step(score, pl_module,
                              trainer.optimizers[0] if trainer.optimizers else None)
        if decision.action != CONTINUE:
            self._set_target(pl_module, decision.model)
            self._rebuild(trainer)
            if self.verbose:  # growth steps are few: say each, as Lightning's own messages
                rank_zero_info(f"DendriteGrowth: epoch {trainer.current_epoch}: "
                               f"{decision.reason}")
        if self.log_metrics:
            self._log(trainer, decision)
        if decision.complete:
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Warn once when an epoch that should have validated did not: without validation
        the callback never reads the monitored metric, so nothing ever grows."""
        if self._validations or self._warned_no_metric or self.controller is None:
            return
        every = trainer.check_val_every_n_epoch
        if every is not None and (trainer.current_epoch + 1) < every:
            return  # no validation due yet
        self._warned_no_metric = True
        if not trainer.is_global_zero:
            return
        logged = sorted(k for k in trainer.callback_metrics if not k.startswith("perfora/"))
        warnings.warn(
            f"DendriteGrowth(monitor={self.monitor!r}): no validation ran by the end of epoch "
            f"{trainer.current_epoch}, so the callback has no {self.monitor!r} to read and "
            f"no dendrites will grow (metrics logged so far: {logged}). Growth needs the "
            "monitored metric after every validation: pass val_dataloaders to trainer.fit "
            "(or define val_dataloader()), keep limit_val_batches above 0, and log it in "
            f"validation_step, e.g. self.log({self.monitor!r}, value, sync_dist=True)",
            UserWarning, stacklevel=2)

    def _warn_if_direction_looks_wrong(self) -> None:
        """A loss maximized or an accuracy minimized keeps the worst model as the best."""
        lower = bool(LOWER_IS_BETTER.search(self.monitor))
        higher = bool(HIGHER_IS_BETTER.search(self.monitor))
        if lower == higher:
            return  # neither, or both ('acc_loss'): no opinion
        if self.mode == "max" and lower:
            kind, better = "a loss or an error", "min"
        elif self.mode == "min" and higher:
            kind, better = "an accuracy-like score", "max"
        else:
            return
        warnings.warn(
            f"DendriteGrowth(monitor={self.monitor!r}, mode={self.mode!r}): the name looks "
            f"like {kind}, for which mode={better!r} is usual. With mode={self.mode!r} perfora "
            f"counts a {'higher' if self.mode == 'max' else 'lower'} {self.monitor!r} as "
            "better, so it keeps and restores the worst model; pass "
            f"mode={better!r} unless that is what you want", UserWarning, stacklevel=2)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish()

    # ------------------------------------------------------------------ helpers
    def _read_monitor(self, trainer: pl.Trainer) -> float:
        metrics = trainer.callback_metrics
        score = read_score(metrics, self.monitor)
        if score is None:
            raise ConfigError(
                f"DendriteGrowth(monitor={self.monitor!r}) found no such metric after "
                f"validation{did_you_mean(self.monitor, metrics)}; logged metrics are "
                f"{sorted(metrics)}. Log it in validation_step, e.g. "
                f"self.log({self.monitor!r}, value, sync_dist=True)")
        return score

    def _rebuild(self, trainer: pl.Trainer) -> None:
        """New DDP wrapper over the new parameters, then configure_optimizers() again."""
        strategy = trainer.strategy
        schedule = capture_schedule(strategy.optimizers, strategy_schedulers(strategy))
        if isinstance(strategy, DeepSpeedStrategy):
            reinitialize_deepspeed(strategy)
            restore_schedule(schedule, strategy.optimizers, strategy_schedulers(strategy))
            return
        if isinstance(strategy, DDPStrategy):
            strategy.model = strategy.lightning_module  # drop the old wrapper's buckets
            strategy.configure_ddp()
        strategy.setup_optimizers(trainer)
        restore_schedule(schedule, strategy.optimizers, strategy_schedulers(strategy))
        if isinstance(strategy, ModelParallelStrategy | FSDPStrategy):
            for optimizer in strategy.optimizers:
                prime_optimizer_state(optimizer)
        if self.controller is not None and strategy.optimizers:  # after a neuron step:
            self.controller.carry_optimizer_state(strategy.optimizers[0])  # moments go on

    def _log(self, trainer: pl.Trainer, decision: Decision) -> None:
        metrics = self.growth_metrics(decision)
        for name, value in metrics.items():
            trainer.callback_metrics[name] = torch.tensor(value)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The controller's state and best snapshot (Lightning saves it in every checkpoint)."""
        if self.controller is None:
            return {} if self._pending is None else dict(self._pending)
        state, best = controller_state(self.controller)
        if best is not None:
            state["best"] = best
        state["module"] = self.module_path
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from a Lightning checkpoint (the weights were already loaded)."""
        if not state_dict:
            return
        if self._stage != "fit":
            return  # test/validate/predict(ckpt_path=...) load weights; the fit's run goes on
        if self.controller is not None:
            self._restore(state_dict)
            return
        self._pending = dict(state_dict)
        trainer = getattr(self._pl_module, "_trainer", None)
        if self._pl_module is not None and trainer is not None:
            # restore now, before the strategy wraps the model: the rule's trainable flags
            # must be set before configure_optimizers runs
            self._ensure_controller(trainer, self._pl_module)

    def _restore(self, state: Mapping[str, Any]) -> None:
        assert self.controller is not None
        saved = state.get("structure")
        have = layer_specs(self.controller.model)
        if saved is not None and dendrite_counts(saved) != dendrite_counts(have):
            raise PerforaError(
                f"the checkpoint's dendrite structure {dendrite_counts(saved)} does not match "
                f"the model's {dendrite_counts(have)}; resume with the same LightningModule and "
                "DendriteGrowth(module=...) as the run that saved it")
        self.controller.load_state(state, state.get("best"))


def warn_if_early_stopping_comes_first(callbacks: list[Any], patience: int) -> None:
    """An EarlyStopping as patient as growth ends the fit at the plateau that would have
    grown the model."""
    for callback in callbacks:
        if isinstance(callback, EarlyStopping) and callback.patience <= patience:
            warnings.warn(f"EarlyStopping(monitor={callback.monitor!r}, patience="
                          f"{callback.patience}) stops the fit at the plateau where "
                          f"DendriteGrowth (patience {patience}) would grow the model, so "
                          "nothing may grow: give it more patience than the growth callback, "
                          "or leave it out (growth completes and stops the fit itself)",
                          UserWarning, stacklevel=3)
