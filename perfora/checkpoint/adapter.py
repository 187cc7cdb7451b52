"""Dendrites as an adapter: save only what growth added, and apply it to a fresh base model.

A large pretrained model that gained dendrites can ship them as a small file, the way PEFT
adapters ship low-rank updates: :func:`save_dendrites` writes each wrapped layer's dendrite
tensors (bank, cascade, ``v``, set masks) and the structure, never the base weights;
:func:`load_dendrites` perforates a freshly built base model the same way and loads them.
A checksum of each wrapped base layer is saved too, so applying the dendrites to other base
weights than they were trained on gives a warning.
"""

from __future__ import annotations

import os
import warnings
import zlib
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, ShapeMismatchError
from ..nn.layers import dendritic_layers, unwrap_model
from ..nn.perforation import fit_structure, layer_specs
from .call_args import model_and_path
from .format import Checkpoint, load_checkpoint, save_checkpoint
from .model_state import shadow_copy

CONTENT = "dendrites"
_GROUP = "dendrites"


def dendrite_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors growth added, by state-dict key (the base layers' own weights left out)."""
    out: dict[str, torch.Tensor] = {}
    for path, layer in dendritic_layers(unwrap_model(model)).items():
        for key, value in layer.state_dict().items():
            if not key.startswith("base."):
                out[f"{path}.{key}"] = value
    return out


def base_checksums(model: nn.Module) -> dict[str, int]:
    """Per wrapped layer, a CRC32 of its base weights (to notice other base weights)."""
    sums: dict[str, int] = {}
    for path, layer in dendritic_layers(unwrap_model(model)).items():
        crc = 0
        for _, tensor in sorted(layer.base.state_dict().items()):
            if tensor.device.type == "meta":
                continue
            crc = zlib.crc32(tensor.detach().cpu().contiguous().view(torch.uint8).numpy()
                             .tobytes(), crc)
        sums[path] = crc
    return sums


def save_dendrites(model: nn.Module | str | os.PathLike,
                   path: str | os.PathLike | nn.Module, **meta: Any) -> None:
    """Write only the dendrites of ``model`` (safetensors + structure), atomically. The
    model and the path may come in either order."""
    model, path = model_and_path(model, path, "save_dendrites(model, path)")
    inner = unwrap_model(model)
    if not dendritic_layers(inner):
        raise CheckpointError("save_dendrites(): the model has no dendritic layers; "
                              "perforate and grow it first")
    _refuse_widened(layer_specs(inner), "save_dendrites(): the model")
    save_checkpoint(path, Checkpoint(
        tensors={_GROUP: dendrite_state(inner)},
        meta={"content": CONTENT, "structure": layer_specs(inner),
              "base_checksums": base_checksums(inner), **meta}))


def load_dendrites(model: nn.Module | str | os.PathLike,
                   path: str | os.PathLike | nn.Module, *, replace: bool = False) -> nn.Module:
    """Perforate ``model`` (a freshly built base model, converted or not) as the saved one was
    and load the saved dendrites; its own base weights are kept. Returns ``model``.

    Everything is checked before ``model`` changes: the set masks against the file's own
    structure (shape, no empty set, the neurons each set feeds), every weight finite, the
    tensors' keys and shapes on a weightless copy. A file that does not fit raises
    :class:`ShapeMismatchError` or :class:`CheckpointError` with ``model`` unchanged.
    A model that already has dendrites keeps them unless ``replace=True``. The model and
    the path may come in either order."""
    model, path = model_and_path(model, path, "load_dendrites(model, path)")
    ckpt = load_checkpoint(path)
    if ckpt.meta.get("content") != CONTENT or _GROUP not in ckpt.tensors:
        raise CheckpointError(f"{path} is not a dendrites file (save_dendrites writes those); "
                              "use perfora.load_model or controller.load for full checkpoints")
    specs, state = ckpt.meta.get("structure"), ckpt.tensors[_GROUP]
    if not isinstance(specs, dict):
        raise CheckpointError(f"{path}: structure: expected an object, got "
                              f"{type(specs).__name__}")
    _refuse_widened(specs, f"load_dendrites(): {path}")
    _refuse_widened(layer_specs(unwrap_model(model)), "load_dendrites(): the model")
    _check_masks(specs, state, str(path))
    _check_finite(state, str(path))
    if not replace:
        _check_no_dendrites(model, str(path))
    shadow = shadow_copy(model)
    if shadow is not None:
        fit_structure(shadow, specs, str(path), ShapeMismatchError)
        _check_fits(shadow, state, str(path))
    fit_structure(model, specs, str(path), ShapeMismatchError)
    _check_fits(model, state, str(path))
    unwrap_model(model).load_state_dict(dict(state), strict=False)
    _warn_on_other_base(model, ckpt.meta.get("base_checksums"), str(path))
    return model


def _refuse_widened(specs: Any, what: str) -> None:
    """CheckpointError when a layer gained neurons: an adapter ships dendrites for a base of
    its original size, and a widened base changed the base weights themselves."""
    widened = sorted(p for p, s in specs.items() if isinstance(s, dict)
                     and (s.get("widened") or s.get("base_blocks")))
    if widened:
        raise CheckpointError(
            f"{what} has layers that gained neurons ({widened[:5]}): a dendrites file holds "
            "only what growth added on top of an unchanged base, but widening changed the "
            "base layers' own weights and shapes; save the whole model with "
            "perfora.save_model and load it with perfora.load_model")
def _check_masks(specs: dict[str, Any], state: dict[str, torch.Tensor], source: str) -> None:
    """CheckpointError unless every layer's ``dendrite_mask`` is what its structure says:
    absent for full sets, else (sets, neurons) with each row feeding exactly the listed
    neurons (a mask that disagrees would load the dendrites onto other neurons)."""
    for path, spec in specs.items():
        key = f"{path}.dendrite_mask" if path else "dendrite_mask"
        mask, neurons = state.get(key), spec.get("neurons") if isinstance(spec, dict) else None
        if mask is None and neurons is None:
            continue
        if mask is None or neurons is None:
            has = "a set mask but no neuron lists" if neurons is None else \
                "neuron lists but no set mask"
            raise CheckpointError(f"{source}: layer {path!r} has {has} in its structure; the "
                                  "file was not written by save_dendrites or was altered")
        shape = (int(spec.get("num_dendrites", -1)), int(spec.get("num_neurons", -1)))
        if tuple(mask.shape) != shape or mask.dtype != torch.bool:
            raise CheckpointError(f"{source}: {key!r} has shape {tuple(mask.shape)} "
                                  f"({mask.dtype}) but the structure says {shape} (bool)")
        for row, (fed, listed) in enumerate(zip(mask, neurons, strict=True)):
            got = fed.nonzero().flatten().tolist()
            if not got:
                raise CheckpointError(f"{source}: {key!r} row {row} is empty: dendrite set "
                                      f"{row} would feed no neuron")
            if got != sorted(listed):
                raise CheckpointError(f"{source}: {key!r} row {row} feeds neurons {got[:8]} "
                                      f"but the structure says {sorted(listed)[:8]}; the file "
                                      "was altered")


def _check_finite(state: dict[str, torch.Tensor], source: str) -> None:
    """CheckpointError naming the first tensor holding NaN or infinity."""
    for key, value in state.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{source}: {key!r} holds NaN or infinite values (not "
                                  "finite); the dendrites were saved from a diverged run")


def _check_no_dendrites(model: nn.Module, source: str) -> None:
    """CheckpointError when ``model`` already has dendrites the load would replace."""
    grown = [p for p, layer in dendritic_layers(unwrap_model(model)).items()
             if layer.num_dendrites]
    if grown:
        raise CheckpointError(f"load_dendrites({source}): the model already has dendrites in "
                              f"{grown[:5]}; loading would replace them. Pass replace=True "
                              "to replace them, or load into a freshly built base model")


def _check_fits(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """ShapeMismatchError unless ``state`` holds exactly the model's dendrite tensors."""
    own = {key: value.shape for key, value in dendrite_state(model).items()}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ShapeMismatchError(f"{source} does not fit this model: missing {missing[:5]}, "
                                 f"unexpected {unexpected[:5]}; build the base model the same "
                                 "way as the one the dendrites were grown on")
    for key, shape in own.items():
        if tuple(state[key].shape) != tuple(shape):
            raise ShapeMismatchError(f"{source}: {key!r} has shape {tuple(state[key].shape)} "
                                     f"in the file but {tuple(shape)} in this model")


def _warn_on_other_base(model: nn.Module, saved: Any, source: str) -> None:
    if not isinstance(saved, dict):
        return
    now = base_checksums(model)
    other = sorted(p for p, crc in saved.items() if p in now and now[p] != crc)
    if other:
        warnings.warn(f"{source}: the base weights of {other[:5]} differ from those the "
                      "dendrites were grown on; the dendrites were loaded, but they were "
                      "trained to correct other weights", stacklevel=3)

