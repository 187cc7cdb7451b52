"""``pairs=``: the readers a user names for a layer, checked before anything changes.

An entry names the modules a layer's outputs go to: Linear/Conv readers (after a flatten with
their repeat), channel norms (BatchNorm, InstanceNorm, GroupNorm), depthwise convs and
stateless modules on the way. Where the model's own search (:mod:`perfora.nn.consumers`)
also finds the layer's readers, the entry must not leave out a reader, a module with state
on the way (a norm, a depthwise conv), or the partner of a gated block: the widening would
leave it narrow and the model would fail at its next forward.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from torch import nn

from ..errors import PerforationError
from .blocks import CHANNEL_NORMS
from .norm_widening import norm_reason
from .plan_types import (
    JOINT_NORMS,
    LayerPlan,
    axis_of,
    grouped_reason,
    is_consumer,
    is_grouped_conv,
    is_producer,
    refuse,
    width_of,
)


def checked_pairs(model: nn.Module, given: LayerPlan, found: LayerPlan) -> LayerPlan:
    """A ``pairs=`` entry against what the search found for the same layer: a reader or a
    module with state on the way (a BatchNorm) that the entry leaves out would not widen,
    and the model would fail at its next forward."""
    if found.partners and not given.partners:
        return refuse(given.path, f"{given.path} widens together with "
                                  f"{', '.join(found.partners)} ({found.found_by}: their "
                                  "outputs are multiplied), which pairs= cannot say; leave "
                                  f"{given.path} out of pairs= and the block is found", "pairs")
    listed = {p for p, _ in [*given.consumers, *given.through]}
    missing = [p for p, _ in found.consumers if p not in listed]
    missing += [p for p, _ in found.through if p not in listed  # a BatchNorm, a depthwise conv
                and any(True for _ in (*model.get_submodule(p).buffers(),
                                       *model.get_submodule(p).parameters()))]
    if not missing:
        return given
    return refuse(given.path, f"pairs[{given.path!r}] leaves out {', '.join(missing)}, which "
                              f"the model's own search finds on its output's way "
                              f"({found.found_by}); list {'it' if len(missing) == 1 else 'them'}"
                              " too, or leave the layer out of pairs=", "pairs")


def _nearest_path(model: nn.Module, path: str) -> str:
    """'; did you mean ...?' with the model's closest module paths (paths are the unwrapped
    model's: no DDP 'module.' prefix), or ''."""
    paths = [p for p, _ in model.named_modules() if p]
    close = difflib.get_close_matches(path, paths, n=3, cutoff=0.5)
    if not close and "." in path:  # e.g. 'module.fc1' under DDP: the last parts may match
        close = [p for p in paths if path.endswith("." + p)][:3]
    return f"; did you mean {' or '.join(repr(p) for p in close)}?" if close else ""


def explicit_entry(model: nn.Module, path: str, readers: Any) -> LayerPlan:
    """A ``pairs=`` entry, checked against the modules it names."""
    try:
        producer = model.get_submodule(path)
    except AttributeError as exc:
        raise PerforationError(f"pairs: {path!r} is not a submodule of this model"
                               f"{_nearest_path(model, path)}") from exc
    if not is_producer(producer):
        return refuse(path, f"a {type(producer).__name__} cannot gain neurons", "pairs")
    if isinstance(readers, str):
        readers = [readers]
    entry = LayerPlan(path, True, found_by="pairs")
    width, axis = width_of(producer, "out"), axis_of(producer)
    readers = [_reader(path, item) for item in readers]
    targets = [target for target, _ in readers]
    if path in targets:
        raise PerforationError(f"pairs[{path!r}]: a layer cannot read its own outputs; list "
                               "the modules its outputs go to")
    twice = sorted({t for t in targets if targets.count(t) > 1})
    if twice:
        raise PerforationError(f"pairs[{path!r}]: {twice[0]!r} is listed twice; list each "
                               "reader once")
    for target, repeat in readers:
        try:
            module = model.get_submodule(target)
        except AttributeError as exc:
            raise PerforationError(f"pairs[{path!r}]: {target!r} is not a submodule of this "
                                   f"model{_nearest_path(model, target)}") from exc
        if isinstance(module, CHANNEL_NORMS):
            why = norm_reason(module, repr(target), width, repr(path))
            if why:
                return refuse(path, f"pairs: {why}", "pairs")
            entry.through.append((target, 1))
        elif is_grouped_conv(module):  # a depthwise conv passes the widening on
            why = grouped_reason(target, module, width, axis, repeat != 1)
            if why:
                return refuse(path, f"pairs: {why}", "pairs")
            entry.through.append((target, axis))
        elif is_consumer(module):
            have = width_of(module, "in")
            if have != width * repeat:
                return refuse(path, f"pairs: {target!r} reads {have} inputs, not "
                                     f"{width} x {repeat}", "pairs")
            entry.consumers.append((target, repeat))
        elif isinstance(module, JOINT_NORMS):
            return refuse(path, f"its outputs are normalised jointly by {target!r} "
                                 f"({type(module).__name__})", "pairs")
        elif not any(True for _ in module.parameters()) and not any(True for _ in
                                                                      module.buffers()):
            entry.through.append((target, axis))
        else:
            return refuse(path, f"pairs: {target!r} ({type(module).__name__}) is neither a "
                                 "Linear/Conv consumer, a channel norm nor stateless", "pairs")
    if not entry.consumers:
        return refuse(path, "pairs: no Linear/Conv consumer listed", "pairs")
    return entry


def _reader(path: str, item: Any) -> tuple[str, int]:
    """One reader of a ``pairs=`` entry as (path, repeat): a path, or (path, repeat) with a
    whole repeat of at least 1."""
    if isinstance(item, str):
        return item, 1
    if isinstance(item, Sequence) and len(item) == 2 and isinstance(item[0], str) \
            and isinstance(item[1], int) and not isinstance(item[1], bool) and item[1] >= 1:
        return item[0], item[1]
    raise PerforationError(f"pairs[{path!r}]: {item!r} is not a reader; give a module path, "
                           "or (path, repeat) with the whole number of positions a flatten "
                           "gives each neuron")
