"""DeepSpeed (ZeRO stages 0-3): ``wrap_deepspeed`` and its backend.

perfora calls ``deepspeed.initialize`` itself, with the recipe it was given, and calls it
again after every restructure: the engine fixes its parameters (and, under ZeRO, their
flat partitions and hooks) when it is built. The replaced engine is retired first (its
module hooks and gradient hooks removed, its partitioned-parameter coordinator dropped), so
no hook fires twice and its buffers can be freed.

Under ZeRO stages 0-2 every rank holds the whole model: growth edits it in place. Under
ZeRO-3 growth, snapshots, the rewind and checkpoint files go layer by layer
(:mod:`perfora.parallel.zero3`): no rank ever holds the whole model on its device.
This relies on DeepSpeed internals; it is tested with deepspeed 0.19.8.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..distributed.fingerprint import check_same_structure
from ..errors import ParallelError
from ..nn.layers import dendritic_layers, unwrap_model
from . import deepspeed_optim, deepspeed_state, zero3
from .base import (
    LayerEdit,
    OptimizerState,
    PairScope,
    Prepare,
    T,
    edit_in_place,
    restore_in_place,
)
from .deepspeed_config import (
    check_config,
    check_model,
    check_model_parameters,
    check_optimizer,
    check_scheduler,
    load_config,
    recipe,
    zero_stage,
)
from .replicated import ReplicatedBackend
from .zero3_widening import Zero3PairwiseWidening

DEEPSPEED_KIND = "deepspeed"
_SPEC_ATTR = "_perfora_wrapper_spec"
_ENGINE_MODULE_ATTRS = ("pre_bwd_fn", "post_bwd_fn", "applied_pre_backward_ref_cnt",
                        "ds_grads_remaining")
@dataclass
class DeepSpeedSpec:
    """How to build the engine again: config, optimizer and scheduler recipes, arguments."""

    config: dict[str, Any]
    optimizer: Callable | None = None
    lr_scheduler: Callable | None = None
    model_parameters: Callable[[nn.Module], Any] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    template: nn.Module | None = field(default=None, repr=False)  # structure only (ZeRO-3)
    engine: nn.Module | None = field(default=None, repr=False)  # the engine in use

    kind = DEEPSPEED_KIND

    @property
    def stage(self) -> int:
        """The ZeRO stage."""
        return zero_stage(self.config)

    def wrap(self, module: nn.Module) -> nn.Module:
        """Retire the engine in use, then ``deepspeed.initialize`` a new one over ``module``."""
        import deepspeed

        if self.engine is not None:
            retire(self.engine)
            self.engine = None
        if self.stage == 3 and self.template is None:
            self.template = zero3.meta_copy(module)  # structure only: nothing allocated
        params = self.model_parameters(module) if self.model_parameters is not None else \
            [p for p in module.parameters() if p.requires_grad]
        engine, _, _, _ = deepspeed.initialize(
            model=module, config=copy.deepcopy(self.config), optimizer=self.optimizer,
            model_parameters=params, lr_scheduler=self.lr_scheduler, **self.kwargs)
        engine.training = module.training  # a new engine starts in train mode: keep eval
        object.__setattr__(engine, _SPEC_ATTR, self)
        self.engine = engine
        return engine


def retire(engine: Any) -> None:
    """Remove an engine's hooks and drop what keeps its buffers alive (DeepSpeed internals)."""
    engine.destroy()
    for name in ("module_forward_pre_hook", "module_forward_post_hook",
                 "first_dataloader_check"):
        handle = getattr(engine, name, None)
        if handle is not None:
            handle.remove()
            setattr(engine, name, None)
    module = getattr(engine, "module", None)
    for m in module.modules() if module is not None else ():
        for attr in _ENGINE_MODULE_ATTRS:  # ZeRO-3 caches its backward functions per module,
            m.__dict__.pop(attr, None)      # closed over the retired engine's coordinator
    # the ZeRO optimizer refers to itself (bound methods, hooks' closures): cleared, its flat
    # buffers, master weights and moments are freed at once instead of at the next gc
    optimizer = getattr(engine, "optimizer", None)
    for owner in (getattr(optimizer, "parameter_offload", None), optimizer):
        if owner is not None and hasattr(owner, "__dict__"):
            owner.__dict__.clear()
    engine.optimizer = engine.lr_scheduler = engine.basic_optimizer = None


class DeepSpeedBackend(ReplicatedBackend):
    """A new engine (same config and recipes) after every restructure; under ZeRO-3 the
    restructure, snapshots and checkpoint files go one layer at a time."""

    name = DEEPSPEED_KIND
    replaces_wrappers = True
    owns_optimizer = True  # the engine builds the optimizer: perfora hands it over
    auto_dcp = False  # DCP cannot read ZeRO partitions

    def __init__(self, spec: DeepSpeedSpec) -> None:
        self.spec = spec

    @property
    def sharded(self) -> bool:
        """True under ZeRO-3: each rank holds slices of the parameters."""
        return self.spec.stage == 3

    @property
    def template(self) -> nn.Module | None:
        """The structure-only copy kept under ZeRO-3 (None under stages 0-2)."""
        return self.spec.template

    def engine_optimizer(self, model: nn.Module) -> Any:
        """The optimizer of the engine in use (DeepSpeed's wrapper under ZeRO)."""
        return getattr(self.spec.engine, "optimizer", None)

    def engine_scheduler(self, model: nn.Module) -> Any:
        """The engine's LR scheduler (built from wrap_deepspeed's recipe), or None."""
        return getattr(self.spec.engine, "lr_scheduler", None)

    def engine_moments(self, model: nn.Module
                       ) -> tuple[dict[str, dict[str, Any]], dict[str, torch.Size]] | None:
        """The engine's optimizer state whole by parameter name (ZeRO 1-3 and fp32 ZeRO-0;
        a collective under ZeRO; see :mod:`perfora.parallel.deepspeed_optim`)."""
        return deepspeed_optim.read_moments(self.spec.engine, unwrap_model(model))

    def load_engine_moments(self, model: nn.Module, states: dict[str, dict[str, Any]]
                            ) -> bool:
        """Write the grown state into the new engine's optimizer (this rank's slices)."""
        return deepspeed_optim.write_moments(self.spec.engine, unwrap_model(model), states)

    def whole_shapes(self, model: nn.Module) -> dict[str, torch.Size]:
        """Each parameter's whole shape (a ZeRO-3 parameter's ``ds_shape``)."""
        return deepspeed_optim.whole_shapes(unwrap_model(model))

    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Every tensor whole (under ZeRO-3 gathered one module at a time, a collective)."""
        inner = unwrap_model(model)
        return zero3.full_state(inner) if self.sharded else inner.state_dict()

    def parameter_count(self, model: nn.Module) -> int:
        """Parameters of the whole model (ZeRO-3 slices report their full size)."""
        return sum(int(getattr(p, "ds_numel", p.numel()))
                   for p in unwrap_model(model).parameters())

    def unshard(self, model: nn.Module) -> nn.Module:
        """The model itself (ZeRO 0-2). ZeRO-3: a plain copy on the CPU with the full state
        (gathered one submodule at a time, a collective), for a checkpoint load; the engine
        is built again over it afterwards."""
        if not self.sharded:
            return model
        return zero3.unpartitioned_copy(unwrap_model(model), self._template())

    def check_load(self) -> None:
        """Checkpoints load into every stage (under ZeRO-3 through an unsharded copy)."""

    def shadow(self, model: nn.Module) -> nn.Module | None:
        """A weightless copy (ZeRO-3: of the structure-only template, since the partitioned
        parameters hide their shapes)."""
        target = self.spec.template if self.sharded else unwrap_model(model)
        return None if target is None else super().shadow(target)

    def rewrap(self, model: nn.Module) -> nn.Module:
        """Check the structure over ranks, retire the engine in use, build a new one (over a
        plain module after a ZeRO-3 load: its structure becomes the template)."""
        module = unwrap_model(model)
        check_same_structure(module)
        if self.sharded and not any(zero3.is_zero3_param(p) for p in module.parameters()):
            self.spec.template = None
        return self.spec.wrap(module)

    def check_rule(self, rule: str) -> None:
        """Only 'gd' under ZeRO-3 (other rules change parameters outside a restructure)."""
        if self.sharded and rule != "gd":
            raise ParallelError(f"rule={rule!r} is not supported under DeepSpeed ZeRO-3 (its "
                                "phase switches and output taps need the whole parameters "
                                "outside a restructure); use rule='gd', or ZeRO stage 1-2")

    def check_config(self, config: Any) -> None:
        """Refuse checkpoint_format='dcp': DCP does not read DeepSpeed's partitions."""
        if getattr(config, "checkpoint_format", "auto") == "dcp":
            raise ParallelError("checkpoint_format='dcp' is not supported under DeepSpeed "
                                "(torch.distributed.checkpoint cannot read ZeRO "
                                "partitions); use 'auto' or 'file': rank 0 writes one "
                                ".safetensors file, gathered one layer at a time")

    def edit_layers(self, model: nn.Module, edit: LayerEdit) -> nn.Module:
        """ZeRO 0-2: each layer edited in place. ZeRO-3: each gathered whole on its own,
        edited and partitioned again before the next (a collective)."""
        inner = unwrap_model(model)
        if not self.sharded:
            edit_in_place(inner, edit)
            return model
        _drop_gradients(inner)
        self.spec.template = zero3.edit_layers(inner, self._template(), edit)
        return model

    def widen(self, model: nn.Module, grow: Callable[[nn.Module, PairScope], T]
              ) -> tuple[nn.Module, T]:
        """ZeRO 0-2: in place. ZeRO-3: one layer pair gathered whole at a time, widened and
        partitioned again before the next (a collective); the engine is rebuilt after."""
        if not self.sharded:
            return super().widen(model, grow)
        inner = unwrap_model(model)
        _drop_gradients(inner)
        step = Zero3PairwiseWidening(inner, self._template())
        result = grow(step.template, step.scope)
        self.spec.template = step.template
        return model, result

    def snapshot(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state (ZeRO 0-2); this rank's slices (ZeRO-3, no gather)."""
        if self.sharded:
            return zero3.snapshot(unwrap_model(model))
        return super().snapshot(unwrap_model(model))

    def whole(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The snapshot whole (ZeRO-3: its slices gathered one tensor at a time)."""
        return zero3.whole(tensors) if self.sharded else dict(tensors)

    def restore(self, model: nn.Module, structure: Mapping[str, Mapping],
                tensors: Mapping[str, torch.Tensor], prepare: Prepare) -> nn.Module:
        """The snapshot's structure and values, in place (ZeRO-3: one layer at a time)."""
        inner = unwrap_model(model)
        if not self.sharded:
            restore_in_place(inner, structure, tensors, prepare)
            return model
        _drop_gradients(inner)
        self.spec.template = zero3.restore(inner, self._template(), structure, tensors,
                                           prepare)
        return model

    @property
    def capture_is_collective(self) -> bool:
        """ZeRO 1-3: the optimizer's moments are read whole for a file on every rank."""
        return self.spec.stage >= 1

    def optimizer_state(self, optimizer: Any, model: nn.Module) -> OptimizerState | None:
        """The engine's optimizer state whole by parameter name (in host memory), its groups'
        learning rates and its scheduler's state (a collective under ZeRO 1-3). None before
        the first step, and where the state is not read (see
        :mod:`perfora.parallel.deepspeed_optim`)."""
        return deepspeed_state.saved_state(self.spec.engine, unwrap_model(model))

    def load_optimizer_state(self, optimizer: Any, model: nn.Module,
                             saved: dict[str, Any], meta: dict[str, Any]) -> None:
        """The saved state into the engine's optimizer and scheduler (this rank's slices)."""
        deepspeed_state.load_saved_state(self.spec.engine, unwrap_model(model), saved, meta)

    def _template(self) -> nn.Module:
        if self.spec.template is None:
            raise ParallelError("perfora lost the structure of this ZeRO-3 model; wrap it "
                                "with perfora.wrap_deepspeed")
        return self.spec.template


def _drop_gradients(module: nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def wrap_deepspeed(model: nn.Module, config: Mapping[str, Any] | str | Path, *,
                   optimizer: Callable | None = None,
                   optimizer_args: Mapping[str, Any] | None = None,
                   lr_scheduler: Callable | None = None,
                   lr_scheduler_args: Mapping[str, Any] | None = None,
                   model_parameters: Callable[[nn.Module], Any] | None = None,
                   **initialize_kwargs: Any) -> nn.Module:
    """A DeepSpeed engine over a perforated model that perfora rebuilds after growth.

    ``config``: the DeepSpeed config (dict or JSON path; ZeRO stage 0-3, no offload, hpZ,
    MiCS or quantized weights). ``optimizer``: an optimizer class or callable
    ``params -> optimizer`` with ``optimizer_args`` (or the config's ``optimizer``
    section), never an instance: growth replaces the parameters. ``lr_scheduler`` likewise
    (the engine steps it at every ``engine.step()``); ``model_parameters``: a callable
    ``module -> parameters or groups`` (default: the trainable parameters). Other keywords
    go to ``deepspeed.initialize``. Call it on every rank, after ``perforate``; the returned
    engine trains as usual (``engine.backward(loss)``, ``engine.step()``).
    """
    cfg = load_config(config)
    check_config(cfg)
    check_model(model)
    check_optimizer(optimizer, cfg)
    check_scheduler(lr_scheduler)
    check_model_parameters(model_parameters)
    for name in ("model", "config", "config_params", "optimizer", "lr_scheduler",
                 "model_parameters"):
        if name in initialize_kwargs:
            raise ParallelError(f"wrap_deepspeed got {name}= twice")
    if not dendritic_layers(model):
        raise ParallelError("wrap_deepspeed needs a perforated model: call "
                            "perfora.perforate(model) first")
    spec = DeepSpeedSpec(cfg, recipe(optimizer, optimizer_args),
                         recipe(lr_scheduler, lr_scheduler_args), model_parameters,
                         dict(initialize_kwargs))
    return spec.wrap(model)
