"""The optimizer carries on through growth: moments kept, the schedule continued.

A widening (and a dendrite set, as ``dendrite_optimizer`` says) replaces parameters
with larger ones whose old entries are a leading slice (new rows and columns are appended; a
dendrite bank whose shape changed starts afresh). :func:`capture` keeps, by parameter name, the
optimizer's per-parameter state, each group's learning rate and the scheduler's state;
:func:`carry_into` puts them into the optimizer rebuilt over the grown model: each moment (a
tensor shaped like its parameter) is copied into the leading slice of a zero tensor of the new
shape, scalars such as Adam's ``step`` as they are. New entries start at zero, as a fresh
optimizer's would. Under FSDP2 each moment is a shard: a widened parameter's moment is gathered
whole (a collective, in name order on every rank), grown, and cut to the new parameter's shard.
Under FSDP1, whose moments are flat slices, :func:`capture_whole` keeps the whole state (the
backend's full optimizer state, a collective) and :func:`carry_whole_into` grows it against the
re-sharded template's shapes and loads it through the backend. Under DeepSpeed, whose engine
builds the optimizer, :func:`capture_engine` and :func:`carry_engine_into` do the same through
the backend's reads and writes of the engine's partitions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..checkpoint.optimizer_state import join_optimizer_state, number_param_groups
from ..nn.layers import unwrap_model
from ..parallel.base import ParallelBackend
from ..parallel.sharded_state import local_shard, optimizer_param_names

_INTERLEAVED = ("bank_weight", "bank_bias")
"""Dendrite bank rows are grouped per set, so new neurons' rows are not appended at the end."""


@dataclass
class CarriedOptimizer:
    """What :func:`capture` kept: per parameter name its state and shape, per group its
    learning rates, and the scheduler's state."""

    states: dict[str, dict[str, Any]]
    shapes: dict[str, torch.Size]
    group_lrs: list[dict[str, Any]]
    scheduler: dict[str, Any] | None


def capture(optimizer: torch.optim.Optimizer | None, scheduler: Any,
            model: nn.Module) -> CarriedOptimizer | None:
    """The optimizer's state by parameter name (None without an optimizer)."""
    if optimizer is None:
        return None
    names = {id(p): name for name, p in unwrap_model(model).named_parameters()}
    states, shapes = {}, {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names.get(id(p))
            if name is not None and optimizer.state.get(p):
                states[name] = dict(optimizer.state[p])
                shapes[name] = p.shape
    return CarriedOptimizer(states, shapes, _group_lrs(optimizer), _scheduler_state(scheduler))


def narrowed(carried: CarriedOptimizer | None, shapes: Mapping[str, torch.Size]
             ) -> CarriedOptimizer | None:
    """The kept state cut back to ``shapes`` (the parameters' after a rewind to a narrower
    best model): each moment keeps its leading slices (a widening appends its block last), so
    neurons grown there again start at zero, not with the undone step's moments. A state that
    cannot be cut (dendrite banks, whose rows interleave) is dropped."""
    if carried is None:
        return None
    states, kept_shapes = {}, {}
    for name, state in carried.states.items():
        old, want = carried.shapes[name], shapes.get(name)
        if want is None or len(want) != len(old) or any(w > o for w, o in zip(want, old)) \
                or (want != old and name.rsplit(".", 1)[-1] in _INTERLEAVED):
            continue
        cut = {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == old:
                for dim, size in enumerate(want):
                    value = value.narrow(dim, 0, size)
                value = value.clone()
            cut[key] = value
        states[name], kept_shapes[name] = cut, want
    return CarriedOptimizer(states, kept_shapes, carried.group_lrs, carried.scheduler)


def _grown(value: torch.Tensor, old: torch.Size, param: torch.Tensor) -> torch.Tensor | None:
    """``value`` (shaped like the old parameter) in the leading slice of zeros shaped like
    ``param``; None when the new shape is not a growth of the old one."""
    if value.shape != old or value.dim() != param.dim() \
            or any(n < o for n, o in zip(param.shape, old, strict=True)):
        return None
    out = torch.zeros(param.shape, dtype=value.dtype, device=value.device)
    out[tuple(slice(0, o) for o in old)] = value
    return out


def _grown_shard(value: torch.Tensor, old: torch.Size, param: torch.Tensor
                 ) -> torch.Tensor | None:
    """:func:`_grown` for a plain moment, or for an FSDP2 shard: gathered whole, grown, and
    cut to ``param``'s shard (a collective)."""
    sharded = hasattr(value, "full_tensor")
    grown = _grown(value.full_tensor() if sharded else value, old, param)
    if grown is None or not hasattr(param, "device_mesh"):
        return grown
    return local_shard(grown, param)


def _group_lrs(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [{key: group[key] for key in ("lr", "initial_lr") if key in group}
            for group in optimizer.param_groups]


def _scheduler_state(scheduler: Any) -> dict[str, Any] | None:
    return scheduler.state_dict() if scheduler is not None and hasattr(
        scheduler, "state_dict") else None


def capture_whole(optimizer: torch.optim.Optimizer | None, scheduler: Any, model: nn.Module,
                  backend: ParallelBackend) -> CarriedOptimizer | None:
    """:func:`capture` where the moments are flat slices (FSDP1): the backend's whole
    optimizer state by parameter name (a collective); None without one."""
    kept = None if optimizer is None else backend.optimizer_state(optimizer, model)
    if kept is None:
        return None
    tensors, meta = kept
    state = join_optimizer_state(tensors, meta)["state"]
    names = meta["param_names"]
    states, shapes = {}, {}
    for index, entry in state.items():
        moments = [v for v in entry.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
        if moments:
            states[names[index]], shapes[names[index]] = dict(entry), moments[0].shape
    return CarriedOptimizer(states, shapes, _group_lrs(optimizer), _scheduler_state(scheduler))


def capture_engine(model: nn.Module, backend: ParallelBackend) -> CarriedOptimizer | None:
    """:func:`capture` for an optimizer the wrapper builds (DeepSpeed): its state whole by
    parameter name, read through the backend (a collective under ZeRO; none where the
    backend cannot read it), its learning rates and its scheduler's state."""
    kept = backend.engine_moments(model)
    states, shapes = kept if kept is not None else ({}, {})
    optimizer = backend.engine_optimizer(model)
    group_lrs = _group_lrs(optimizer) if hasattr(optimizer, "param_groups") else []
    return CarriedOptimizer(states, shapes, group_lrs,
                            _scheduler_state(backend.engine_scheduler(model)))


def carry_engine_into(carried: CarriedOptimizer | None, model: nn.Module,
                      backend: ParallelBackend) -> None:
    """:func:`carry_into` for the wrapper's new optimizer: each kept moment grown to its
    parameter's whole new shape, then written through the backend (this rank's slices); the
    learning rates and the scheduler's state carried on."""
    if carried is None:
        return
    states = _grown_whole(carried, backend.whole_shapes(model))
    if states:
        backend.load_engine_moments(model, states)
    optimizer = backend.engine_optimizer(model)
    if hasattr(optimizer, "param_groups"):
        _continue_schedule(carried, optimizer, backend.engine_scheduler(model))


def carry_whole_into(carried: CarriedOptimizer | None, optimizer: torch.optim.Optimizer | None,
                     scheduler: Any, model: nn.Module, backend: ParallelBackend) -> None:
    """:func:`carry_into` for :func:`capture_whole`: each kept moment grown to its parameter's
    whole new shape (read from the backend's template), then loaded through the backend, which
    cuts it to this rank's slices (a collective)."""
    template = backend.template
    if carried is None or optimizer is None or template is None:
        return
    shapes = {name: p.shape for name, p in template.named_parameters()}
    names = optimizer_param_names(optimizer, unwrap_model(model))
    grown = _grown_whole(carried, shapes)
    state = {index: grown[name] for index, name in enumerate(names) if name in grown}
    _continue_schedule(carried, optimizer, scheduler)
    if not state:
        return
    fresh = next(iter(state.values()))
    for index, name in enumerate(names):  # e.g. an undone dendrite set's: as a fresh state
        if index not in state and name in shapes:
            state[index] = _fresh_state(fresh, shapes[name])
    backend.load_optimizer_state(
        optimizer, model, {"state": state, "param_groups": number_param_groups(
            optimizer.param_groups)}, {"param_names": names})


def _grown_whole(carried: CarriedOptimizer, shapes: dict[str, torch.Size]
                 ) -> dict[str, dict[str, Any]]:
    """Each kept state grown to its parameter's whole new shape (``shapes``, by name), in
    name order; parameters that are gone or cannot take it are left out."""
    out = {}
    for name in sorted(carried.states):
        if name in shapes:
            entry = _grown_state(name, carried, torch.empty(shapes[name], device="meta"),
                                 _grown)
            if entry:
                out[name] = entry
    return out


def _fresh_state(like: dict[str, Any], shape: torch.Size) -> dict[str, Any]:
    """A never-stepped state with ``like``'s keys for a parameter of ``shape``: moments zero,
    scalar tensors (Adam's ``step``) zero. FSDP1's whole-state load needs every parameter's."""
    out: dict[str, Any] = {}
    for key, value in like.items():
        if isinstance(value, torch.Tensor):
            out[key] = torch.zeros(shape if value.dim() > 0 else (), dtype=value.dtype,
                                   device=value.device)
        else:
            out[key] = type(value)(0) if isinstance(value, int | float) else value
    return out


def carry_into(carried: CarriedOptimizer | None, optimizer: torch.optim.Optimizer | None,
               scheduler: Any, model: nn.Module) -> None:
    """Give the rebuilt ``optimizer`` (and ``scheduler``) what :func:`capture` kept."""
    if carried is None or optimizer is None:
        return
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    params = {name: p for name, p in unwrap_model(model).named_parameters()
              if id(p) in optimized}  # not a frozen one (the correlation rule's base)
    for name in sorted(carried.states):  # the same order on every rank (FSDP2 gathers)
        param = params.get(name)
        entry = {} if param is None else _grown_state(name, carried, param, _grown_shard)
        if entry:
            optimizer.state[param] = entry
    _continue_schedule(carried, optimizer, scheduler)


def _grown_state(name: str, carried: CarriedOptimizer, param: torch.Tensor,
                 grow: Any) -> dict[str, Any]:
    """The kept state of ``name`` fitted to ``param``'s shape: moments grown with
    ``grow(value, old_shape, param)``, scalars as they are; empty where it cannot be."""
    old = carried.shapes[name]
    if param.shape != old and name.rsplit(".", 1)[-1] in _INTERLEAVED:
        return {}
    state: dict[str, Any] = {}
    for key, value in carried.states[name].items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            grown = value if param.shape == old else grow(value, old, param)
            if grown is None:
                return {}
            state[key] = grown
        else:
            state[key] = value
    return state


def _continue_schedule(carried: CarriedOptimizer, optimizer: torch.optim.Optimizer,
                       scheduler: Any) -> None:
    """Each group's kept learning rate, and the scheduler's kept state."""
    if len(carried.group_lrs) == len(optimizer.param_groups):
        for group, lrs in zip(optimizer.param_groups, carried.group_lrs, strict=True):
            group.update(lrs)
    if scheduler is not None and carried.scheduler is not None:
        scheduler.load_state_dict(carried.scheduler)
