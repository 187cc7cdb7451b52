"""An optimizer's state split into tensors (for safetensors) and JSON metadata, and joined
back."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import torch


def split_optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Optimizer state as (tensors by flat key, JSON-able rest)."""
    return split_state_dict(optimizer.state_dict())


def split_state_dict(sd: Mapping[str, Any]) -> tuple[dict, dict]:
    """An optimizer state_dict as (tensors by flat key, JSON-able rest)."""
    tensors: dict[str, torch.Tensor] = {}
    state_json: dict[str, dict] = {}
    for idx, entry in sd["state"].items():
        plain = {}
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value
            else:
                plain[key] = value
        state_json[str(idx)] = plain
    return tensors, {"state": state_json, "param_groups": sd["param_groups"]}


def join_optimizer_state(tensors: Mapping[str, torch.Tensor], meta: Mapping) -> dict:
    """Inverse of :func:`split_optimizer_state`."""
    state: dict[int, dict] = {int(k): dict(v) for k, v in meta["state"].items()}
    for flat, value in tensors.items():
        idx, key = flat.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    groups = []
    for group in meta["param_groups"]:
        groups.append({k: (tuple(v) if isinstance(v, list) and k != "params" else v)
                       for k, v in group.items()})
    return {"state": state, "param_groups": groups}


def number_param_groups(groups: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Param groups with each group's ``params`` replaced by consecutive indices, as an
    optimizer's ``state_dict`` numbers them (the order of the groups, then of their params)."""
    numbered, start = [], 0
    for group in groups:
        count = len(group["params"])
        numbered.append({**{k: v for k, v in group.items() if k != "params"},
                         "params": list(range(start, start + count))})
        start += count
    return numbered


def reindex_by_name(saved: Mapping[str, Any], saved_names: list[str], names: list[str],
                    groups: list[Mapping[str, Any]]) -> dict:
    """A state dict saved by parameter name (FSDP1, DeepSpeed) for an optimizer whose
    parameters are ``names`` (index -> name) in ``groups``: each entry moved to its
    parameter's index here, the groups numbered as this optimizer's, with the saved learning
    rates where the group counts agree. ValueError when a saved name is not here."""
    index = {name: i for i, name in enumerate(names)}
    state = {}
    for i, entry in saved["state"].items():
        if not 0 <= int(i) < len(saved_names) or saved_names[int(i)] not in index:
            raise ValueError(f"saved optimizer state {i} names no parameter of this optimizer")
        state[index[saved_names[int(i)]]] = entry
    numbered = number_param_groups(list(groups))
    if len(saved["param_groups"]) == len(numbered):
        for group, kept in zip(numbered, saved["param_groups"], strict=True):
            group.update({k: kept[k] for k in ("lr", "initial_lr") if k in kept})
    return {"state": state, "param_groups": numbered}


def scheduler_state_or_none(state: Mapping[str, Any] | None, stacklevel: int = 3
                            ) -> dict[str, Any] | None:
    """An LR scheduler's state if JSON can hold it (a checkpoint keeps it as JSON); None,
    with a warning that it restarts on resume, otherwise."""
    if state is None:
        return None
    try:
        json.dumps(state)
    except TypeError:
        warnings.warn("the scheduler's state is not JSON-serializable and was not saved; "
                      "it restarts from its initial state on resume", stacklevel=stacklevel)
        return None
    return dict(state)
