"""A DeepSpeed engine's optimizer state, read whole by parameter name and written into the
engine built after a neuron step, so the moments carry on through a widening.

Under ZeRO 1-3 each rank holds a slice of flat fp32 partitions, and the optimizer's state
(Adam's ``exp_avg``, SGD's ``momentum_buffer``...) is keyed by those partitions. DeepSpeed's
``safe_get_full_optimizer_state`` reads one parameter's moment whole (a collective) and
``safe_set_full_optimizer_state`` writes it into this rank's slice. A new engine has no state
yet (the optimizer makes it at its first step), so :func:`write_moments` first takes one step
at learning rate 0 over zero gradients and puts the partitions back as they were, which
leaves every moment at zero, then writes the kept ones. Under ZeRO-0 in fp32 the engine's
optimizer is the torch optimizer itself, keyed by the module's parameters; under ZeRO-0 in
bf16 or fp16 (DeepSpeed's unfused wrapper around a torch optimizer) it is keyed by each
parameter's fp32 master copy; DeepSpeed's BF16_Optimizer (bf16 under ZeRO-1 with fp32
gradient accumulation) keeps flat fp32 partitions as ZeRO 1-2 do. Other set-ups (the fused
wrapper around DeepSpeed's own fused optimizers, offloaded optimizers) are not read: their
moments restart at zero. :mod:`perfora.parallel.deepspeed_state`
puts the same state in checkpoint files. Relies on DeepSpeed internals;
tested with deepspeed 0.19.8.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

Moments = dict[str, dict[str, Any]]
"""Per parameter name: each state key's value (moments whole, shaped like the parameter;
scalars such as ``step`` as they are)."""


_FLAT_PARTITIONS = ("single_partition_of_fp32_groups",  # ZeRO 1-2
                    "fp32_groups_flat_partition",  # BF16_Optimizer (bf16, ZeRO-1, fp32 grads)
                    "fp32_partitioned_groups_flat")  # ZeRO-3
"""Where each optimizer keeps the flat fp32 partitions its inner optimizer steps."""


def _zero_optimizer(engine: Any) -> Any:
    """The engine's partitioned optimizer (ZeRO stages 1-3, or the BF16_Optimizer DeepSpeed
    uses for bf16 under ZeRO-1 with fp32 gradient accumulation), or None."""
    optimizer = getattr(engine, "optimizer", None)
    if any(hasattr(optimizer, name) for name in _FLAT_PARTITIONS):
        return optimizer
    return None


def _is_stage3(zero: Any) -> bool:
    return hasattr(zero, "fp32_partitioned_groups_flat")


def _plain_optimizer(engine: Any, module: nn.Module) -> torch.optim.Optimizer | None:
    """The engine's optimizer when it is a torch optimizer over the module's own parameters
    (ZeRO-0 in fp32), else None."""
    optimizer = getattr(engine, "optimizer", None)
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    own = {id(p) for p in module.parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    return optimizer if held and all(id(p) in own for p in held) else None


def _fp32_masters(engine: Any, module: nn.Module) -> dict[str, torch.Tensor] | None:
    """Each parameter's fp32 master copy, by name, where the engine's optimizer keeps one per
    parameter (the unfused bf16/fp16 wrapper DeepSpeed uses without ZeRO); else None."""
    optimizer = getattr(engine, "optimizer", None)
    lows, highs = getattr(optimizer, "fp16_groups", None), getattr(optimizer, "fp32_groups", None)
    if _zero_optimizer(engine) is not None or not lows or not highs \
            or not all(isinstance(group, list) for group in highs):
        return None
    names = {id(p): name for name, p in module.named_parameters()}
    return {names[id(low)]: high for lgroup, hgroup in zip(lows, highs, strict=True)
            for low, high in zip(lgroup, hgroup, strict=True) if id(low) in names}


def _partitions(zero: Any) -> list[torch.Tensor]:
    """The flat fp32 partitions the inner optimizer steps."""
    for name in _FLAT_PARTITIONS:
        if hasattr(zero, name):
            return list(getattr(zero, name))
    return []


def _partition_states(zero: Any) -> Iterator[dict[str, Any]]:
    for flat in _partitions(zero):
        state = zero.optimizer.state.get(flat)
        if state:
            yield state


def _shape(param: torch.Tensor) -> torch.Size:
    """A parameter's whole shape (a ZeRO-3 parameter holds an empty placeholder)."""
    return torch.Size(getattr(param, "ds_shape", param.shape))


def read_moments(engine: Any, module: nn.Module) -> tuple[Moments, dict[str, torch.Size]] | None:
    """Every parameter's optimizer state whole (under ZeRO in host memory), and its shape;
    None where this set-up is not read (see the module docstring) or the optimizer has no
    state yet. Under ZeRO a collective: call it on every rank."""
    plain = _plain_optimizer(engine, module)
    if plain is not None:
        states = {name: dict(plain.state[p]) for name, p in module.named_parameters()
                  if plain.state.get(p)}
        return states, {name: p.shape for name, p in module.named_parameters()
                        if name in states}
    masters = _fp32_masters(engine, module)
    if masters is not None:
        inner = engine.optimizer.optimizer
        states = {name: {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                         for k, v in inner.state[master].items()}
                  for name, master in masters.items() if inner.state.get(master)}
        return states, {name: masters[name].shape for name in states}
    zero = _zero_optimizer(engine)
    if zero is None or getattr(zero, "cpu_offload", False) \
            or getattr(zero, "offload_optimizer", False):
        return None
    first = next(_partition_states(zero), None)
    if first is None:
        return None
    from deepspeed.utils import safe_get_full_optimizer_state

    moment_keys = sorted(k for k, v in first.items()
                         if isinstance(v, torch.Tensor) and v.dim() > 0)
    scalars = {k: v for k, v in first.items() if k not in moment_keys}
    states, shapes = {}, {}
    for name, param in sorted(module.named_parameters()):  # one order on every rank
        if not param.requires_grad:
            continue
        entry = dict(scalars)
        for key in moment_keys:
            value = safe_get_full_optimizer_state(param, key)
            if value is None:
                break
            entry[key] = value.detach().to("cpu", copy=True)  # host memory, not the device's
        else:
            states[name], shapes[name] = entry, _shape(param)
    return states, shapes


def whole_shapes(module: nn.Module) -> dict[str, torch.Size]:
    """Each parameter's whole shape (ZeRO-3 included)."""
    return {name: _shape(p) for name, p in module.named_parameters()}


def write_moments(engine: Any, module: nn.Module, states: Moments) -> bool:
    """Give the new engine's optimizer ``states`` (grown to the widened shapes); False where
    this set-up is not written. Writes only this rank's slices (no collective)."""
    plain = _plain_optimizer(engine, module)
    if plain is not None:
        params = dict(module.named_parameters())
        for name, entry in states.items():
            if name in params:
                plain.state[params[name]] = entry
        return True
    masters = _fp32_masters(engine, module)
    if masters is not None:
        inner = engine.optimizer.optimizer
        for name, entry in states.items():
            if name in masters:
                inner.state[masters[name]] = {
                    k: v.to(masters[name].device) if isinstance(v, torch.Tensor) else v
                    for k, v in entry.items()}
        return True
    zero = _zero_optimizer(engine)
    if zero is None or getattr(zero, "cpu_offload", False) \
            or getattr(zero, "offload_optimizer", False):
        return False
    _make_state(zero)
    from deepspeed.utils import safe_set_full_optimizer_state

    params = dict(module.named_parameters())
    scalars: dict[str, Any] = {}
    for name in sorted(states):
        param = params.get(name)
        if param is None:
            continue
        for key, value in states[name].items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                if _is_stage3(zero):
                    _set_zero3_slice(zero, param, value, key)
                else:
                    safe_set_full_optimizer_state(param, value, key)
            else:
                scalars[key] = value
    for state in _partition_states(zero):
        for key, value in scalars.items():
            if key in state:
                state[key] = value.clone() if isinstance(value, torch.Tensor) else value
    return True


def _set_zero3_slice(zero: Any, param: torch.Tensor, value: torch.Tensor, key: str) -> None:
    """This rank's slice of ``value`` into the ZeRO-3 state ``key`` of ``param``. DeepSpeed's
    own setter reads past the end on the last rank when the parameter does not divide evenly
    (its slice is padded); here the padding is zero."""
    part, _ = zero._get_fp32_opt_state_partition(param, release_swap_buffers=False,
                                                  optim_state_key=key)
    start = part.numel() * zero._get_param_partition_rank(param)
    piece = value.detach().flatten()[start:start + part.numel()]
    with torch.no_grad():
        part.zero_()
        part[:piece.numel()].copy_(piece)


def _make_state(zero: Any) -> None:
    """Create the inner optimizer's state over the flat partitions (one step at learning rate
    0 over zero gradients; the partitions are put back as they were), then link each
    parameter's view into it, as DeepSpeed does at its first step."""
    inner = zero.optimizer
    flats = _partitions(zero)
    if all(inner.state.get(flat) for flat in flats):
        return
    kept = [flat.detach().clone() for flat in flats]
    lrs = [group["lr"] for group in inner.param_groups]
    stage3 = _is_stage3(zero)
    try:
        for group in inner.param_groups:
            group["lr"] = 0.0
        for index, flat in enumerate(flats):
            flat.grad = torch.zeros_like(flat)
            if stage3:  # ZeRO-3 hands the optimizer one partition per step, as here
                group = inner.param_groups[zero.sub_group_to_group_id[index]]
                held, group["params"] = group["params"], [flat]
                try:
                    inner.step()
                finally:
                    group["params"] = held
        if not stage3:
            inner.step()
    finally:
        for group, lr in zip(inner.param_groups, lrs, strict=True):
            group["lr"] = lr
        with torch.no_grad():
            for flat, value in zip(flats, kept, strict=True):
                flat.grad = None
                flat.copy_(value)
    if not stage3:
        zero._lazy_init_hp_params_optimizer_state()


def kept_moment_keys(engine: Any) -> set[str] | None:
    """The moments (``exp_avg``...) the engine's partitioned optimizer keeps per parameter,
    its state created first where it has none yet; None where the engine is not partitioned
    (a torch optimizer takes whatever state it is given) or its optimizer is offloaded."""
    zero = _zero_optimizer(engine)
    if zero is None or getattr(zero, "cpu_offload", False) \
            or getattr(zero, "offload_optimizer", False):
        return None
    _make_state(zero)
    first = next(_partition_states(zero), {})
    return {k for k, v in first.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
