"""A plain model's checkpoint loads into the perforated model: the keys of a layer before it
was wrapped (``fc.weight``; a grouped norm's ``bn.weight``) are moved to where the wrapped
layer keeps them (``fc.base.weight``; ``fc.base.0.weight``, ``fc.base.1.weight``), so
pretrained weights can be loaded after ``perforate`` (with ``strict=False`` they were skipped
without a word, and the model kept its random weights)."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from torch import nn


def adopt_plain_keys(layer: nn.Module, state_dict: MutableMapping[str, Any],
                     prefix: str) -> None:
    """Move ``layer``'s plain keys in ``state_dict`` (loaded at ``prefix``) into its wrapped
    form, where none of the wrapped form is there already. (A grouped norm's keys sit under
    another module: torch hands a layer only its own keys, so the model's load pre-hook,
    :func:`adopt_grouped_norm_keys`, moves those.)"""
    base = layer.base
    if _grouped(layer):
        _move(state_dict, prefix, prefix + "base.0.", base[0])
    else:
        _move(state_dict, prefix, prefix + "base.", base)


def adopt_grouped_norm_keys(module: nn.Module, state_dict: MutableMapping[str, Any],
                            prefix: str, *args: Any) -> None:
    """Load pre-hook of a perforated model: a grouped norm's plain keys (``bn1.weight``)
    moved into its layer (``conv1.base.1.weight``)."""
    for path, layer in module.named_modules():
        norm = getattr(layer, "grouped_with", None)
        if norm and _grouped(layer):
            _move(state_dict, f"{prefix}{norm}.", f"{prefix}{path}.base.1.", layer.base[1])


def add_plain_key_hook(module: nn.Module) -> None:
    """Give the perforated ``module`` the :func:`adopt_grouped_norm_keys` pre-hook (once)."""
    if not _plain_key_hooks(module):
        module.register_load_state_dict_pre_hook(adopt_grouped_norm_keys)


def remove_plain_key_hook(module: nn.Module) -> None:
    """Take that pre-hook off ``module`` (an exported copy holds nothing of perfora's)."""
    for key in _plain_key_hooks(module):
        del module._load_state_dict_pre_hooks[key]


def _plain_key_hooks(module: nn.Module) -> list[int]:
    return [key for key, h in module._load_state_dict_pre_hooks.items()
            if getattr(h, "hook", h) is adopt_grouped_norm_keys]


def _grouped(layer: nn.Module) -> bool:
    base = getattr(layer, "base", None)
    return bool(getattr(layer, "grouped", False)) and isinstance(base, nn.Sequential) \
        and len(base) == 2


def _move(state_dict: MutableMapping[str, Any], source: str, target: str,
          module: nn.Module) -> None:
    names = list(module.state_dict(keep_vars=True))
    if any(target + name in state_dict for name in names):
        return  # the wrapped form: a perfora checkpoint
    for name in names:
        if source + name in state_dict:
            state_dict[target + name] = state_dict.pop(source + name)
