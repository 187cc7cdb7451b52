"""A DeepSpeed engine's optimizer state in a checkpoint file and back: the moments whole by
parameter name (as :mod:`perfora.parallel.deepspeed_optim` reads and writes them), each
group's learning rate and the engine's LR scheduler state, so that a run resumed from the
file continues exactly (ZeRO 0-3)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from ..checkpoint.optimizer_state import scheduler_state_or_none, split_state_dict
from .deepspeed_optim import Moments, kept_moment_keys, read_moments, whole_shapes, write_moments


def _group_names(engine: Any, module: nn.Module) -> list[list[str]]:
    """The parameter names of each of the optimizer's groups, in group order (ZeRO keeps the
    module's parameters of group ``i`` in ``bit16_groups[i]``; ZeRO-0 in the groups)."""
    names = {id(p): name for name, p in module.named_parameters()}
    optimizer = engine.optimizer
    groups = getattr(optimizer, "bit16_groups", None) or getattr(optimizer, "bf16_groups", None) \
        or getattr(optimizer, "fp16_groups", None)
    if groups is None:
        groups = [group["params"] for group in optimizer.param_groups]
    return [[names[id(p)] for p in group if id(p) in names] for group in groups]


def _hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    """A group's settings JSON can hold (``lr``, ``betas``...; no tensors)."""
    plain = (bool, int, float, str, type(None))
    return {k: list(v) if isinstance(v, tuple) else v for k, v in group.items()
            if k != "params" and (isinstance(v, plain) or (isinstance(v, list | tuple)
                                                            and all(isinstance(x, plain)
                                                                    for x in v)))}


def saved_state(engine: Any, module: nn.Module) -> tuple[dict[str, torch.Tensor], dict] | None:
    """The engine's optimizer state for a checkpoint, as a torch optimizer's state dict by
    parameter name: the moments whole (tensors), each group's settings (learning rate...) and
    the engine's LR scheduler state (JSON). None where it is not read (see
    :mod:`perfora.parallel.deepspeed_optim`) or before the optimizer's first step. A
    collective under ZeRO."""
    read = read_moments(engine, module)
    if read is None or not read[0]:
        return None
    states = read[0]
    groups, names = [], []
    for group, members in zip(engine.optimizer.param_groups, _group_names(engine, module),
                              strict=False):
        kept = [name for name in members if name in states]
        groups.append({**_hyperparameters(group),
                       "params": list(range(len(names), len(names) + len(kept)))})
        names += kept
    tensors, meta = split_state_dict({"state": {i: states[name] for i, name in enumerate(names)},
                                      "param_groups": groups})
    scheduler = getattr(engine, "lr_scheduler", None)
    return tensors, {**meta, "param_names": names, "engine_scheduler": scheduler_state_or_none(
        scheduler.state_dict() if hasattr(scheduler, "state_dict") else None, 5)}


def load_saved_state(engine: Any, module: nn.Module, saved: dict[str, Any],
                     meta: dict[str, Any]) -> None:
    """Put :func:`saved_state`'s content (joined: ``saved["state"]`` by index) into the
    engine's optimizer and scheduler (this rank's slices; no collective). Raises ValueError,
    before anything is written, when it names parameters or shapes this model does not
    have, or a different number of groups."""
    names = list(meta.get("param_names") or [])
    if saved["state"] and not names:
        warnings.warn("the checkpoint's optimizer state was saved by index (a torch optimizer, "
                      "not a DeepSpeed engine): the engine's moments start afresh",
                      stacklevel=4)
        return
    shapes = whole_shapes(module)
    states: Moments = {}
    for index, entry in saved["state"].items():
        if not 0 <= index < len(names) or names[index] not in shapes:
            raise ValueError(f"saved optimizer state {index} names no parameter of this model")
        name = names[index]
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 \
                    and value.shape != shapes[name]:
                raise ValueError(f"{name}: saved {key} of shape {list(value.shape)}, the "
                                 f"parameter's is {list(shapes[name])}")
        states[name] = dict(entry)
    _check_keys(engine, states)
    groups = engine.optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        raise ValueError(f"{len(saved['param_groups'])} saved parameter groups, the "
                         f"engine's optimizer has {len(groups)}")
    if states and not write_moments(engine, module, states):
        warnings.warn("this DeepSpeed set-up's optimizer state is not written (an offloaded "
                      "optimizer, or the fused wrapper of FusedAdam): the moments restart "
                      "at zero", stacklevel=4)
    for group, kept in zip(groups, saved["param_groups"], strict=True):
        group.update({k: kept[k] for k in ("lr", "initial_lr") if k in kept})
    scheduler = getattr(engine, "lr_scheduler", None)
    if scheduler is not None and meta.get("engine_scheduler") is not None:
        scheduler.load_state_dict(meta["engine_scheduler"])


def _check_keys(engine: Any, states: Moments) -> None:
    """Under ZeRO: the saved moments are the ones the engine's optimizer keeps (Adam's are
    not SGD's); ValueError otherwise, before anything is written."""
    wanted = kept_moment_keys(engine) if states else None
    if wanted is None:
        return
    for name, entry in states.items():
        have = {k for k, v in entry.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
        if have != wanted:
            raise ValueError(f"{name}: saved optimizer state {sorted(have)}, the engine's "
                             f"optimizer keeps {sorted(wanted)}")
