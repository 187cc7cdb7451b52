"""The optimizer carries on through neuron growth: moments kept, the schedule continued.

A widening replaces parameters with larger ones whose old entries are a leading slice (new
rows and columns are appended). :func:`capture` keeps, by parameter name, the optimizer's
per-parameter state, each group's learning rate and the scheduler's state; :func:`carry_into`
puts them into the optimizer rebuilt over the widened model: each moment (a tensor shaped like
its parameter) is copied into the leading slice of a zero tensor of the new shape, scalars
such as Adam's ``step`` as they are. New entries start at zero, as a fresh optimizer's would.
Under FSDP2 each moment is a shard: a widened parameter's moment is gathered whole (a
collective, in name order on every rank), grown, and cut to the new parameter's shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..nn.layers import unwrap_model
from ..parallel.sharded_state import local_shard

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
    lrs = [{key: group[key] for key in ("lr", "initial_lr") if key in group}
           for group in optimizer.param_groups]
    sched = scheduler.state_dict() if scheduler is not None and hasattr(scheduler,
                                                                        "state_dict") else None
    return CarriedOptimizer(states, shapes, lrs, sched)


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


def carry_into(carried: CarriedOptimizer | None, optimizer: torch.optim.Optimizer | None,
               scheduler: Any, model: nn.Module) -> None:
    """Give the rebuilt ``optimizer`` (and ``scheduler``) what :func:`capture` kept."""
    if carried is None or optimizer is None:
        return
    params = dict(unwrap_model(model).named_parameters())
    for name in sorted(carried.states):  # the same order on every rank (FSDP2 gathers)
        saved = carried.states[name]
        param = params.get(name)
        if param is None:
            continue
        old = carried.shapes[name]
        if param.shape != old and name.rsplit(".", 1)[-1] in _INTERLEAVED:
            continue
        state: dict[str, Any] = {}
        for key, value in saved.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                grown = value if param.shape == old else _grown_shard(value, old, param)
                if grown is None:
                    state = {}
                    break
                state[key] = grown
            else:
                state[key] = value
        if state:
            optimizer.state[param] = state
    if len(carried.group_lrs) == len(optimizer.param_groups):
        for group, lrs in zip(optimizer.param_groups, carried.group_lrs, strict=True):
            group.update(lrs)
    if scheduler is not None and carried.scheduler is not None:
        scheduler.load_state_dict(carried.scheduler)
