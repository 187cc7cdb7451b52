"""Widen a model to the widths of a saved state that carries no record of its widenings: a
``save_pretrained`` folder reloaded by ``from_pretrained``, or ``load_state_dict`` of a state
grown elsewhere (ddp_spawn's workers hand their model back that way). Each wrapped layer whose
saved weight has more neurons is widened, with the readers the plan finds, in one step, then
the saved values are loaded. A fused gate-and-up layer replays its widening steps instead,
when the caller has them (``load_grown_pretrained`` reads them from the saved config,
:mod:`perfora.nn.fused_record`); without them it is refused: its rows' order depends on the
steps (:mod:`perfora.nn.chunked`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..errors import PerforationError
from .consumers import plan_widening
from .fused_record import RECORD_KEY, steps_for
from .layers import dendritic_layers, unwrap_model
from .narrowing import narrow_widenings
from .widening import out_dim, widen


def widen_to_saved(model: nn.Module, state: Mapping[str, torch.Tensor],
                   fused: Mapping[str, list[int]] | None = None) -> list[str]:
    """Widen the wrapped layers of ``model`` whose saved base weight in ``state`` has more
    output neurons, each in one step (the readers found by :func:`plan_widening`), so a
    state dict saved without perfora's structure record (``save_pretrained``) loads; a fused
    gate-and-up layer in the steps ``fused`` gives it (path -> neurons per step).
    Returns the paths widened. Computed in one block per layer, the reloaded model equals the
    saved one within float rounding; :func:`perfora.save_model` records each step and reloads
    to the bit."""
    inner = unwrap_model(model)
    grown = _grown_layers(inner, state)
    plan = plan_widening(inner) if grown else None
    replays: dict[str, list[int]] = {}
    for path in grown:  # refused before anything changes
        if plan is not None and path in plan.layers and plan.layers[path].chunks > 1:
            replays[path] = _fused_replay(path, inner.get_submodule(path), state,
                                          plan.layers[path].chunks, fused or {})
    widened = []
    for path in grown:  # in forward order; a partner (Llama's up_proj) widens with its layer
        extra = _grown_by(path, inner.get_submodule(path), state)
        if extra > 0:
            for k in replays.get(path, [extra]):
                widen(inner, path, k)
            widened.append(path)
    return widened


def _fused_replay(path: str, layer: nn.Module, state: Mapping[str, torch.Tensor],
                  chunks: int, fused: Mapping[str, list[int]]) -> list[int]:
    """The widening steps of the fused layer at ``path`` (neurons each), checked against the
    rows its saved weight has; PerforationError without them or when they do not add up."""
    steps = steps_for(fused, path)
    if steps is None:
        raise PerforationError(f"{path} {_UNORDERED}")
    rows = _grown_by(path, layer, state)
    if sum(steps) * chunks != rows:
        raise PerforationError(
            f"{path}: the saved config's {RECORD_KEY} gives it steps of {steps} neurons, "
            f"{sum(steps) * chunks} rows in all, but its saved weight has {rows} more rows than "
            "the model: the config and the weights come from different runs")
    return steps


def _grown_layers(inner: nn.Module, state: Mapping[str, torch.Tensor]) -> list[str]:
    """The wrapped layers whose saved base weight has more output neurons."""
    return [path for path, layer in dendritic_layers(inner).items()
            if _grown_by(path, layer, state) > 0]


def _grown_by(path: str, layer: nn.Module, state: Mapping[str, torch.Tensor]) -> int:
    """How many more output neurons the saved base weight of the layer at ``path`` has."""
    core = layer.source
    key = next((f"{path}.{name}" for name, p in layer.named_parameters() if p is core.weight),
               None)
    saved = state.get(key) if key is not None else None
    od = out_dim(core)
    return 0 if saved is None else max(0, int(saved.shape[od]) - int(core.weight.shape[od]))


_UNORDERED = ("is a fused gate-and-up layer that gained neurons: the order of its saved rows "
              "depends on the widening steps, which this state does not record (a "
              f"save_pretrained folder keeps them in config.json's {RECORD_KEY}, which "
              "load_grown_pretrained reads). Save the run with perfora.save_model and load it "
              "with perfora.load_model (it replays the steps), or load "
              "perfora.export(model)'s plain weights")


def adopt_saved_widths(module: nn.Module, state_dict: Mapping[str, torch.Tensor], prefix: str,
                       *_: object) -> None:
    """``load_state_dict`` pre-hook that :func:`perfora.perforate` puts on the model: where the
    state holds a wrapped layer with more neurons (a run that grew neurons elsewhere, e.g. in
    ddp_spawn's workers, handed back), widen it and its readers first, so the load fits, as a
    layer takes a saved dendrite count. The loaded values replace the widened ones. Sharded
    layers, and states that differ from the model in anything but widths, are left to the
    load (which reports the mismatch)."""
    local = {key[len(prefix):]: value for key, value in state_dict.items()
             if key.startswith(prefix)}
    applied: list[tuple[str, int]] = []  # (path, its widenings before): undone on failure
    for path, layer in dendritic_layers(module).items():  # forward order: readers follow
        core = layer.source
        key = next((f"{path}.{name}" for name, p in layer.named_parameters()
                    if p is core.weight), None)
        saved = local.get(key) if key is not None else None
        if saved is None or layer._sharded() or saved.dim() != core.weight.dim():
            continue
        od = out_dim(core)
        now = core.weight.shape
        if saved.shape[od] > now[od] > 0 and all(
                a == b for d, (a, b) in enumerate(zip(saved.shape, now)) if d != od):
            extra = int(saved.shape[od]) - int(now[od])
            entry = plan_widening(module).layers.get(path)
            if entry is None or not entry.widenable:
                for done, keep in reversed(applied):
                    narrow_widenings(module, done, keep)
                raise PerforationError(
                    f"load_state_dict: the state gives {prefix}{path} {saved.shape[od]} "
                    f"neurons (the model has {now[od]}), and the model's readers of {path!r} "
                    f"are not known ({entry.reason if entry else 'it cannot gain neurons'}). "
                    "Load the run with perfora.load_model (it replays the widenings it "
                    f"recorded), or widen the model first: perfora.widen(model, {path!r}, "
                    f"{extra}, pairs=...)")
            if entry.chunks > 1:
                for done, keep in reversed(applied):
                    narrow_widenings(module, done, keep)
                raise PerforationError(f"load_state_dict: {prefix}{path} {_UNORDERED}")
            applied.append((path, len(getattr(layer, "widenings", None) or [])))
            widen(module, entry, extra)


def add_width_hook(module: nn.Module) -> None:
    """Give ``module`` the :func:`adopt_saved_widths` load pre-hook (once)."""
    if not _width_hooks(module):
        module.register_load_state_dict_pre_hook(adopt_saved_widths)


def remove_width_hook(module: nn.Module) -> None:
    """Take the :func:`adopt_saved_widths` load pre-hook off ``module`` (an exported copy
    must hold nothing of perfora's)."""
    for key in _width_hooks(module):
        del module._load_state_dict_pre_hooks[key]


def _width_hooks(module: nn.Module) -> list[int]:
    return [key for key, h in module._load_state_dict_pre_hooks.items()
            if getattr(h, "hook", h) is adopt_saved_widths]
