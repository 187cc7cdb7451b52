"""``resize_token_embeddings`` on a Hugging Face model whose output layer (``lm_head``) is a
dendritic layer: transformers resizes only an ``nn.Linear`` head (a wrapped untied one raised
``TypeError``) and, for a tied one, resized the shared weight under the wrapper and left its
dendrite bank at the old vocabulary (the next forward failed on the shapes).

``perforate`` gives such a model a per-instance ``resize_token_embeddings``
(:class:`ResizeTokenEmbeddings`): transformers resizes the wrapped ``nn.Linear`` itself (the
wrapper steps aside for the call, with the tied-weight keys it renamed), then the wrapper
takes the resized layer back and its dendrite sets follow the new vocabulary: new tokens get
bank rows of their own with zero ``v`` (their logits are the base layer's, as in a plain
model), removed tokens give theirs back. The model's outputs on the old tokens are unchanged.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import PerforationError
from .layers import DendriticLayer
from .narrowing import _shrink_dendritic_producer
from .tied import rename_tied_keys
from .widening import _widen_dendritic_producer


class ResizeTokenEmbeddings:
    """``model.resize_token_embeddings`` for a model with a dendritic output layer (see the
    module docstring); a model whose output layer is not wrapped resizes as transformers
    does. Set on the instance by :func:`add_resize_hook`."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                 mean_resizing: bool = True) -> Any:
        model = self.model
        plain = type(model).resize_token_embeddings
        head = model.get_output_embeddings()
        if not isinstance(head, DendriticLayer):
            return plain(model, new_num_tokens, pad_to_multiple_of, mean_resizing)
        path = next(p for p, m in model.named_modules() if m is head)
        _check_head(head, path)
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        before = head.num_neurons
        setattr(parent, name, head.base)  # transformers resizes its own nn.Linear
        rename_tied_keys(model, f"{path}.base", path)
        try:
            result = plain(model, new_num_tokens, pad_to_multiple_of, mean_resizing)
        finally:
            head.base = model.get_output_embeddings()  # the resized Linear (or the old one)
            setattr(parent, name, head)
            rename_tied_keys(model, path, f"{path}.base")
        resize_head_rows(head, before, path)
        return result


def _check_head(head: DendriticLayer, path: str) -> None:
    if head.kind != "linear" or head.grouped or head.neuron_axis != -1 or head._sharded():
        raise PerforationError(
            f"resize_token_embeddings: the output layer {path!r} is a dendritic "
            f"{type(head.source).__name__} perfora cannot resize (only an unsharded Linear "
            "over the last axis). Resize the embeddings before perfora.perforate, or "
            f"perforate without it (leave {path!r} out of paths=/types=)")


def resize_head_rows(head: DendriticLayer, before: int, path: str) -> None:
    """Make ``head``'s dendrite sets match its base's output rows (``before`` neurons until
    now): new neurons get random bank rows with zero ``v``, removed ones give theirs back."""
    now = int(head.source.weight.shape[0])
    if now > before:
        _widen_dendritic_producer(head, now - before, None)
    elif now < before:
        _shrink_dendritic_producer(head, before - now, path)


def add_resize_hook(model: nn.Module) -> None:
    """Give a Hugging Face model whose output layer is wrapped the resize above (once)."""
    get_head = getattr(model, "get_output_embeddings", None)
    if not callable(getattr(type(model), "resize_token_embeddings", None)) \
            or not callable(get_head) \
            or isinstance(model.__dict__.get("resize_token_embeddings"), ResizeTokenEmbeddings):
        return
    try:
        head = get_head()
    except (AttributeError, NotImplementedError):
        return
    if isinstance(head, DendriticLayer):
        model.resize_token_embeddings = ResizeTokenEmbeddings(model)


def remove_resize_hook(model: nn.Module) -> None:
    """Take the per-instance resize off ``model`` (an exported copy holds nothing of
    perfora's)."""
    if isinstance(model.__dict__.get("resize_token_embeddings"), ResizeTokenEmbeddings):
        del model.__dict__["resize_token_embeddings"]
