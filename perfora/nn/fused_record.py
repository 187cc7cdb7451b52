"""The widening steps of fused gate-and-up layers, kept in a Hugging Face model's config.

The saved rows of a fused layer (Phi-3's ``gate_up_proj``, ModernBERT's ``Wi``) that gained
neurons are in the order of its widening steps (:mod:`perfora.nn.chunked`), which the weights
alone do not tell. So the steps go into the config as ``perfora_fused_widenings`` (layer path
-> the neurons each step added), ``save_pretrained`` and ``trainer.save_model`` write them to
``config.json``, and :func:`perfora.integrations.transformers.load_grown_pretrained` replays
them before it loads the weights. Other layers need no record: one block per layer loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ..errors import PerforationError
from ..warn import warn_user
from .export_config import hf_models
from .layers import unwrap_model

RECORD_KEY = "perfora_fused_widenings"
"""The config attribute (and ``config.json`` key) that holds the record."""


def fused_steps(root: nn.Module) -> dict[str, list[int]]:
    """Path (inside ``root``) -> the neurons each widening step added, for every fused layer
    (one whose output a block cuts into chunks) that gained neurons."""
    out: dict[str, list[int]] = {}
    for path, module in root.named_modules():
        events = getattr(module, "widenings", None) or []
        if any(int(event.get("chunks", 1)) > 1 for event in events):
            out[_model_path(path)] = [int(event["k"]) for event in events]
    return out


_WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module"})


def _model_path(path: str) -> str:
    """``path`` under the model's own names, as its state dict keys are: without the
    segments FSDP1's and activation checkpointing's wrappers add."""
    return ".".join(part for part in path.split(".") if part not in _WRAPPER_SEGMENTS)


def note_fused_widenings(model: nn.Module) -> None:
    """Write the record of every Hugging Face model in ``model`` into its config (or take it
    out where no fused layer holds a widening): called wherever widths change."""
    for hf in hf_models(unwrap_model(model)).values():
        steps, config = fused_steps(hf), hf.config
        try:
            if steps:
                setattr(config, RECORD_KEY, steps)
            elif RECORD_KEY in vars(config):
                delattr(config, RECORD_KEY)
        except (AttributeError, TypeError, ValueError) as exc:  # a config that takes no extras
            warn_user(f"perfora: {type(config).__name__} does not take the attribute "
                      f"{RECORD_KEY} ({exc}), so a save_pretrained folder of this model will "
                      "not say how its fused gate-and-up layers grew; save it with "
                      "perfora.save_model to reload it")


def drop_record(model: nn.Module) -> None:
    """Take the record out of the configs in ``model`` (an exported copy: its fused layers
    are plain layers in the block's order, which load without one)."""
    for hf in hf_models(model).values():
        vars(hf.config).pop(RECORD_KEY, None)


def read_record(config: Mapping[str, Any]) -> dict[str, list[int]]:
    """The record in a saved ``config.json`` (as a dict); empty where it has none.
    Raises PerforationError on a record that is not path -> list of positive counts."""
    record = config.get(RECORD_KEY) or {}
    ok = isinstance(record, dict) and all(
        isinstance(path, str) and isinstance(steps, list) and steps and all(
            isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in steps)
        for path, steps in record.items())
    if not ok:
        raise PerforationError(f"config.json: {RECORD_KEY} must map layer paths to lists of "
                               f"positive neuron counts, got {record!r}")
    return record


def steps_for(record: Mapping[str, list[int]], path: str) -> list[int] | None:
    """The steps ``record`` gives the layer at ``path``: its own entry, or the one entry that
    ``path`` ends with (a record written from a model nested in the one loading, e.g. a
    controller given ``Phi3Model`` inside ``Phi3ForCausalLM``: the two share one config)."""
    if path in record:
        return list(record[path])
    matches = [key for key in record if path.endswith(f".{key}")]
    return list(record[matches[0]]) if len(matches) == 1 else None
