"""Rehearse a load on a weightless copy of the model, so a file that does not fit fails first.

Everything a controller load does (structure, weights, rule state, optimizer and scheduler
state, best snapshot) is done on a copy whose tensors live on the meta device: a checkpoint
that would break half-way raises CheckpointError before the real model changes.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..checkpoint.model_state import rehearse_load, shadow_copy
from ..checkpoint.optimizer_state import join_optimizer_state
from ..checkpoint.schema import check_like, validate_structure, with_keys_of
from ..config import PerforaConfig
from ..errors import CheckpointError, ConversionError
from ..nn.layers import dendritic_layers
from ..nn.perforation import fit_structure, layer_specs
from ..parallel.base import ParallelBackend
from ..rules import make_rule, validate_rule_state
from .optim import OptimizerRecipe, SchedulerRecipe, step_scheduler
from .saved_run import FRAMEWORK_SOURCE, SavedRun
from .surgery import apply_activation


def framework_state(meta: Any, best: Mapping[str, torch.Tensor] | None, model: nn.Module,
                    backend: ParallelBackend, config: PerforaConfig) -> SavedRun:
    """The run state a framework saved (Lightning, HF Trainer: :meth:`state_dict` plus
    ``best_structure``, and the best snapshot's tensors), checked and rehearsed on a
    weightless copy of ``model`` (which has the saved structure already): CheckpointError
    before anything changes when it is malformed or does not fit."""
    if not isinstance(meta, Mapping) or "controller" not in meta:
        raise CheckpointError("the saved perfora state has no controller entry")
    source = FRAMEWORK_SOURCE
    run = SavedRun(structure=layer_specs(model), controller=meta["controller"],
                   rule=meta.get("rule", {}), best_structure=meta.get("best_structure"))
    run.state()  # checked first
    try:
        validate_rule_state(run.rule, structure=run.structure)
        if run.best_structure is not None:
            run.best_structure = validate_structure(run.best_structure, "best_structure")
    except CheckpointError as exc:
        raise CheckpointError(f"{source}: {exc}") from None
    shadow = backend.shadow(model)
    if shadow is not None:
        rehearse_rule(shadow, config, run.rule, source)
        if best is not None and run.best_structure is not None:
            fit_structure(shadow, run.best_structure, "the saved best structure")
            rehearse_load(shadow, best, "the saved best snapshot")
    if best is not None and run.best_structure is not None:
        run.best_tensors = dict(best)
    return run


def rehearse_rule(shadow: nn.Module, config: PerforaConfig, state: Mapping[str, Any],
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


def rehearse_checkpoint(model: nn.Module, run: SavedRun, config: PerforaConfig,
                        optimizer: OptimizerRecipe | None = None,
                        scheduler: SchedulerRecipe | None = None,
                        activation: str | None = None) -> None:
    """Everything a controller load does, done on a weightless copy of ``model`` first.

    Raises CheckpointError (ShapeMismatchError) where the real load would fail half-way:
    the structure, the weights, the rule state, the optimizer and scheduler state, and the
    best snapshot are each fitted to the copy. Does nothing for models that cannot be
    copied (sharded ones): then the file's own checks are all that runs first."""
    source = run.source
    shadow = shadow_copy(model)
    if shadow is None:
        return
    fit_structure(shadow, run.structure, source)
    if activation is not None:
        try:
            apply_activation(dendritic_layers(shadow), activation)
        except ConversionError as exc:
            raise CheckpointError(f"{source}: {exc}") from exc
    rehearse_load(shadow, run.model, source)
    ruled = rehearse_rule(shadow, config, run.rule, source)
    if optimizer is not None and ruled:  # (the trainable flags come from the rule)
        _rehearse_optimizer(shadow, run, config, optimizer, scheduler)
    if run.best_tensors is not None:
        fit_structure(shadow, run.best_structure, f"{source} (best_structure)")
        rehearse_load(shadow, run.best_tensors, f"{source} (best snapshot)")


def _rehearse_optimizer(shadow: nn.Module, run: SavedRun, config: PerforaConfig,
                        optimizer: OptimizerRecipe, scheduler: SchedulerRecipe | None) -> None:
    """Load the saved optimizer and scheduler state into fresh ones over the shadow model,
    then take one step with zero gradients (on the meta device: no memory, no values).

    Where a fresh optimizer can step on the meta device (Adam, SGD...), a saved state that
    would break the first real step (a missing key, a moment of another shape or dtype)
    is refused now; the others get the checks ``load_state_dict`` does."""
    source = run.source

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
    if run.optimizer is not None:
        saved = join_optimizer_state(run.optimizer_tensors, run.optimizer)
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
    if scheduler is None or run.scheduler is None:
        return
    try:
        sched = scheduler.build(opt)
    except Exception:  # the real build raises the same error, with the real model
        return
    try:
        check_like(run.scheduler, sched.state_dict(), "scheduler")
        sched.load_state_dict(with_keys_of(copy.deepcopy(run.scheduler), sched.state_dict()))
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
