"""FSDP1's optimizer state as full tensors by parameter name, and back.

FSDP1 (``use_orig_params=True``) gives each rank flat 1-D slices of every parameter, and the
optimizer's moments are slices too, so their shapes say nothing about the parameters'.
torch's ``get_optimizer_state_dict``/``set_optimizer_state_dict`` with
``full_state_dict=True`` gather them whole (by parameter name) and cut them again; these
helpers put that in the form perfora saves (an optimizer ``state_dict`` indexed in the
optimizer's order, with the parameters' names beside it). Both are collectives.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..checkpoint.optimizer_state import number_param_groups


def full_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module
                         ) -> tuple[dict[str, Any], list[str]]:
    """The optimizer's state_dict with whole tensors, and its parameters' names in order."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    full = get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True))
    names = [name for group in full["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(names)}
    state = {index[name]: dict(entry) for name, entry in full["state"].items()}
    return {"state": state, "param_groups": number_param_groups(full["param_groups"])}, names


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module,
                              saved: dict[str, Any], names: list[str]) -> None:
    """Load a state_dict of whole tensors (:func:`full_optimizer_state`'s form) into the
    optimizer of an FSDP1 model; each rank keeps its slices."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    full = {"state": {names[int(i)]: entry for i, entry in saved["state"].items()},
            "param_groups": [{**group, "params": [names[int(i)] for i in group["params"]]}
                             for group in saved["param_groups"]]}
    try:
        set_optimizer_state_dict(model, optimizer, full,
                                 options=StateDictOptions(full_state_dict=True))
    except (RuntimeError, KeyError) as exc:  # callers report ValueError as a CheckpointError
        raise ValueError(f"the optimizer state does not fit this optimizer ({exc})") from exc
