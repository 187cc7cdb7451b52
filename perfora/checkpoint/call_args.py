"""The arguments of the save and load calls: a model and a path, in either order."""

from __future__ import annotations

from typing import Any

from torch import nn


def model_and_path(first: Any, second: Any, call: str) -> tuple[nn.Module, Any]:
    """(model, path) from two arguments given in either order (``torch.save`` puts the
    object first, ``save_model`` the path): a TypeError when neither is a module."""
    if isinstance(first, nn.Module) and not isinstance(second, nn.Module):
        return first, second
    if isinstance(second, nn.Module) and not isinstance(first, nn.Module):
        return second, first
    raise TypeError(f"{call} takes a model (an nn.Module) and a path, got "
                    f"{type(first).__name__} and {type(second).__name__}")
