"""The config of an exported Hugging Face model after neuron growth: the feed-forward width it
names (Llama's and BERT's ``intermediate_size``, GPT-2's ``n_inner``, T5's ``d_ff``) is set to
the grown width, so ``save_pretrained`` then ``from_pretrained`` builds layers of the saved
shapes. Where one number cannot describe the model (layers of different widths), the export
warns, naming the layers and what to do instead.

Duck-typed: a model with a ``config`` that has ``to_dict`` and a class with
``from_pretrained``, the exported model itself or the outermost such modules inside it (a
wrapper's ``self.lm``); transformers is not imported here.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..warn import warn_user
from .plan_types import width_of

FFN_WIDTH_KEYS = ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "ffn_hidden_size",
                  "dim_feedforward", "hidden_dim", "mlp_dim")
"""Config fields that name a transformer's feed-forward width, in the order they are tried."""


def grown_widths(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Each layer that gained neurons, path -> (the width it started with, its width now),
    from the widenings recorded on the producers (a partner, Llama's up_proj, widens with
    its producer: a widening of either counts for both)."""
    added: dict[str, int] = {}
    chunks: dict[str, int] = {}  # a fused gate-and-up layer: rows per neuron
    for path, module in model.named_modules():
        for event in getattr(module, "widenings", None) or []:
            for target in [path, *event.get("partners", [])]:
                added[target] = added.get(target, 0) + int(event["k"])
                chunks[target] = int(event.get("chunks", 1))
    out = {}
    for path, k in added.items():
        now = width_of(model.get_submodule(path), "out") // chunks[path]
        out[path] = (now - k, now)
    return out


def _config_width(config: Any, key: str) -> int | None:
    value = getattr(config, key, None)
    if key == "n_inner" and value is None and hasattr(config, "n_embd"):
        return 4 * int(config.n_embd)  # GPT-2: None means four times the model width
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _is_hf_model(module: nn.Module) -> bool:
    config = getattr(module, "config", None)
    return config is not None and hasattr(config, "to_dict") \
        and hasattr(type(module), "from_pretrained")


def hf_models(model: nn.Module) -> dict[str, nn.Module]:
    """The outermost Hugging Face models in ``model`` (itself included, at path ""), by path;
    the models nested inside one of them are left out."""
    found: dict[str, nn.Module] = {}
    for path, module in model.named_modules():
        if any(path == p or path.startswith(f"{p}.") or not p for p in found):
            continue
        if _is_hf_model(module):
            found[path] = module
    return found


def update_exported_config(exported: nn.Module, grown: dict[str, tuple[int, int]]) -> None:
    """Set each Hugging Face model's (copied) config in ``exported`` to the feed-forward width
    its layers grew to; warn where that cannot describe them (see the module docstring)."""
    for prefix, hf in hf_models(exported).items():
        inside = {path[len(prefix) + 1:] if prefix else path: widths
                  for path, widths in grown.items()
                  if not prefix or path.startswith(f"{prefix}.")}
        _update_config(hf, inside, prefix)


def _update_config(exported: nn.Module, grown: dict[str, tuple[int, int]], prefix: str) -> None:
    """Update one Hugging Face model's config; ``grown`` holds paths inside it, which sits at
    ``prefix`` in the exported model ("" for the root)."""
    if not grown:
        return
    config = exported.config
    starts = {before for before, _ in grown.values()}
    widths = {now for _, now in grown.values()}
    key = next((k for k in FFN_WIDTH_KEYS if _config_width(config, k) in starts), None)
    old = getattr(config, key) if key is not None else None
    if key is not None and len(widths) == 1:
        setattr(config, key, next(iter(widths)))
    mismatched = _mismatched_shapes(exported)
    if not mismatched:
        return
    if key is not None:
        setattr(config, key, old)  # one width would not describe them: left as it was
    items = sorted(grown.items())
    at = f"{prefix}." if prefix else ""
    layers = ", ".join(f"{at}{path}: {before} -> {now}" for path, (before, now) in items[:4])
    layers += f" and {len(items) - 4} more" if len(items) > 4 else ""
    if key is not None:
        named = (f"config.{key} holds one width for all of them; growth that widens every "
                 "block alike gives a config that loads")
    else:
        named = f"its config names no such width (looked for {', '.join(FFN_WIDTH_KEYS)})"
    owner = f" (the model at {prefix})" if prefix else ""
    warn_user(
        f"perfora.export: the grown layers' widths ({layers}) cannot be written into "
        f"{type(config).__name__}{owner}: {named}. A model built from the exported config has "
        f"other shapes ({', '.join(mismatched[:2])}), so save_pretrained would write a "
        "folder that from_pretrained cannot load. Save the exported model's state dict "
        "(safetensors) and load it into a model you build and widen alike, or keep the "
        "perforated model and use perfora.save_model/load_model (or load_grown_pretrained)")


def _mismatched_shapes(exported: nn.Module) -> list[str]:
    """The state keys whose shapes differ between ``exported`` and a model of its class built
    (on the meta device, no memory) from its config; [] when that cannot be built."""
    try:
        with torch.device("meta"):
            fresh = type(exported)(copy.deepcopy(exported.config))
    except Exception:  # noqa: BLE001 - a class that cannot be built so: nothing to check
        return []
    want = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
    return [f"{k}: {want[k]} built, {tuple(v.shape)} exported"
            for k, v in exported.state_dict().items() if k in want
            and want[k] != tuple(v.shape)]
