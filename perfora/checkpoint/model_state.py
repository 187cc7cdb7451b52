"""A model's state against a saved one: check keys and shapes, load with clear messages, and
rehearse a load on a weightless copy before the model itself changes."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import ShapeMismatchError
from ..nn.layers import dendritic_layers, unwrap_model


def check_state_fits(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """ShapeMismatchError naming the tensor unless ``state`` has exactly the model's keys and
    shapes (nothing is loaded)."""
    own = unwrap_model(model).state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise ShapeMismatchError(
            f"{source} does not fit this model: missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{'...' if len(unexpected) > 5 else ''}. Build the model the same way as the run "
            "that saved it (same class and sizes)")
    for key, value in state.items():
        if own[key].shape != value.shape:
            raise ShapeMismatchError(
                f"{source}: tensor {key!r} has shape {tuple(value.shape)} in the checkpoint "
                f"but {tuple(own[key].shape)} in this model; build the model with the same "
                "sizes as the run that saved it")


def load_state_into(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """load_state_dict with messages that name the tensor and both shapes."""
    check_state_fits(model, state, source)
    unwrap_model(model).load_state_dict(dict(state), strict=True)


def shadow_copy(model: nn.Module) -> nn.Module | None:
    """A copy of ``model`` (unwrapped) whose tensors live on the meta device: it costs no
    memory, and a load can be rehearsed on it before the model itself is changed.

    None when the model cannot be copied (sharded DTensor parameters, or modules that
    refuse ``copy.deepcopy``)."""
    inner = unwrap_model(model)
    memo: dict[int, Any] = {}
    for tensor in itertools.chain(inner.parameters(), inner.buffers()):
        if type(tensor).__name__ == "DTensor" or type(tensor.data).__name__ == "DTensor":
            return None
        if id(tensor) in memo:
            continue
        empty = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
        memo[id(tensor)] = (nn.Parameter(empty, requires_grad=tensor.requires_grad)
                            if isinstance(tensor, nn.Parameter) else empty)
    try:
        return copy.deepcopy(inner, memo)
    except Exception:  # a module that cannot be copied: no rehearsal, the file is still checked
        return None


def rehearse_load(shadow: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Load ``state`` into a :func:`shadow_copy`: checks keys and shapes, moves no weights.

    The dendrite output weights ``v`` and set masks (dendrite sets x neurons each, small)
    get their real values, since code that runs after a load reads them (a learning rule
    checks that a candidate's ``v`` row is zero); every other tensor stays weightless."""
    check_state_fits(shadow, state, source)
    own = shadow.state_dict()
    real = {f"{path}.{name}" if path else name for path in dendritic_layers(shadow)
            for name in ("out_weight", "dendrite_mask")}
    weightless = {key: (value.detach().to("cpu", own[key].dtype, copy=True) if key in real
                        else torch.empty(value.shape, dtype=own[key].dtype, device="meta"))
                  for key, value in state.items()}
    shadow.load_state_dict(weightless, strict=True, assign=True)

