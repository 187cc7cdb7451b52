"""Save and load a perforated model (structure and weights, no controller state)."""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from ..errors import CheckpointError, ShapeMismatchError
from ..nn.layers import unwrap_model
from ..nn.perforation import fit_structure, layer_specs
from .call_args import model_and_path
from .format import Checkpoint, load_checkpoint, save_checkpoint
from .model_state import load_state_into, rehearse_load, shadow_copy


def save_model(path: str | os.PathLike | nn.Module, model: nn.Module | str | os.PathLike,
               **meta: Any) -> None:
    """Save a perforated model (structure + weights) without controller state. The model
    and the path may come in either order."""
    model, path = model_and_path(path, model, "save_model(path, model)")
    ckpt = Checkpoint(tensors={"model": unwrap_model(model).state_dict()},
                      meta={"structure": layer_specs(model), **meta})
    save_checkpoint(path, ckpt)


def load_model(model: nn.Module | str | os.PathLike, path: str | os.PathLike | nn.Module
               ) -> nn.Module:
    """Load structure and weights into ``model`` (converted or not); returns it. The model
    and the path may come in either order.

    The load is rehearsed on a weightless copy first: a checkpoint that does not fit raises
    before ``model`` is changed."""
    model, path = model_and_path(model, path, "load_model(model, path)")
    ckpt = load_checkpoint(path)
    if "model" not in ckpt.tensors:
        raise CheckpointError(f"{path} holds no model weights")
    if "structure" not in ckpt.meta:
        raise CheckpointError(f"{path}: structure: missing")
    specs, state = ckpt.meta["structure"], ckpt.tensors["model"]
    shadow = shadow_copy(model)
    if shadow is not None:
        fit_structure(shadow, specs, str(path), ShapeMismatchError)
        rehearse_load(shadow, state, str(path))
    fit_structure(model, specs, str(path), ShapeMismatchError)
    load_state_into(model, state, str(path))
    return model
