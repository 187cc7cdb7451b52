"""Load a grown Hugging Face model saved with ``save_pretrained``/``trainer.save_model`` into a
freshly built one: :func:`load_grown_pretrained` (the saved dendrites and widths first, then
every tensor strictly, under the names transformers itself would load them by)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint.files import read_regular_file
from ..checkpoint.schema import MAX_HEADER_BYTES
from ..errors import CheckpointError
from ..nn.fused_record import read_record
from ..nn.saved_widths import widen_to_saved
from ._common import perforate_once


def load_grown_pretrained(model: nn.Module, folder: str | os.PathLike, *,
                          module: str | None = None, **perforate_kwargs: Any) -> nn.Module:
    """Load a grown model saved by ``trainer.save_model(folder)`` into a fresh ``model``.

    ``model`` is built from the config (``Model(config)``); it is perforated as in training
    (the same ``module`` and ``perforate_kwargs``), takes the dendrite counts and widths of
    the saved tensors and loads them strictly. A layer that gained neurons is widened in one
    step: the reloaded model equals the saved one within float rounding (the saved model
    computed each widening as a block of its own). A fused gate-and-up layer (Phi-3's
    ``gate_up_proj``) replays the widening steps the saved ``config.json`` records, and
    reloads to the bit."""
    import safetensors.torch

    folder = Path(folder)
    perforate_once(model.get_submodule(module) if module else model, perforate_kwargs)
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        shards = json.loads(read_regular_file(index, MAX_HEADER_BYTES, "weights index")
                            )["weight_map"].values()
        files = [folder / name for name in sorted(set(shards))]
    else:
        raise CheckpointError(f"{folder} has neither model.safetensors nor its index")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(safetensors.torch.load_file(str(file), device="cpu"))
    state = _renamed_to_model(model, state)
    _fill_tied(model, state)
    widen_to_saved(model, state, _saved_fused_steps(folder))  # grown in training
    model.load_state_dict(state, strict=True)
    return model


def _saved_fused_steps(folder: Path) -> dict[str, list[int]]:
    """The fused layers' widening steps that the folder's config.json records (none without
    the file or the record)."""
    path = folder / "config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(read_regular_file(path, MAX_HEADER_BYTES, "config"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not JSON: {exc}") from exc
    return read_record(config) if isinstance(config, dict) else {}


def _renamed_to_model(model: nn.Module, state: dict[str, torch.Tensor]
                      ) -> dict[str, torch.Tensor]:
    """The saved keys under the model's names: transformers 5 saves some models under their
    legacy names (ViT's ``attention.attention.query``) and renames them as it loads; the
    same renames apply here. A key that would need converting (tensors merged or split)
    raises CheckpointError."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key
    except ImportError:  # transformers 4: saved under the model's own names
        return state
    names = set(model.state_dict())
    if set(state) <= names:
        return state
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
    out = {}
    for key, value in state.items():
        new = key
        if key not in names:
            new, converted = rename_source_key(key, renamings, converters)
            if converted is not None and new not in names:
                raise CheckpointError(
                    f"{key}: transformers converts this saved tensor as it loads "
                    f"({type(model).__name__}: merged or split weights), which "
                    "load_grown_pretrained does not do; load the run with "
                    "perfora.load_model, or save it with perfora.save_model")
        out[new] = value
    return out


def _fill_tied(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Give each tied key that save_pretrained stored once the tensor of its saved twin."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    for names in groups.values():
        saved = next((n for n in names if n in state), None)
        for name in names:
            if saved is not None and name not in state:
                state[name] = state[saved]
