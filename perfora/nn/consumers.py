"""Which layers can gain neurons, and what reads their outputs: :func:`plan_widening`.

A layer can gain neurons only when every reader of its outputs is known and can gain zeroed
input columns. The readers are found, in this order:

1. ``pairs=``: an explicit mapping, for any model (``{"block.fc1": ["block.fc2"]}``; a
   consumer after a flatten as ``("head", repeat)``; a channel norm or a stateless module on the
   way listed among the consumers is widened or applied block by block), checked by
   :mod:`perfora.nn.explicit_pairs`;
2. the known Transformer feed-forward pairs (:mod:`perfora.nn.known_blocks`: torch's
   encoder/decoder layers, BERT, GPT-2, Llama, T5, the ViT and CLIP MLPs, GPT-NeoX, Falcon,
   BLOOM, GPT-J, OPT and the BART family); only the hidden
   width grows, never ``d_model``;
3. ``nn.Sequential`` chains through activations, dropout, pooling, channel norms (BatchNorm,
   InstanceNorm, and GroupNorm in whole groups), depthwise convs
   (which gain channels of their own) and ``Flatten``, and into transformers' ``*ConvLayer``
   modules (ResNet);
4. ``torch.fx`` symbolic tracing (:mod:`perfora.nn.fx_follow`), where the model traces, else
   in the blocks around the layer whose forwards trace (an MLP block); it also follows a chain
   that leaves its ``nn.Sequential`` before the reader (VGG's ``features`` -> ``classifier``),
   and through a squeeze-excitation gate (:mod:`perfora.nn.gates`).

A layer whose output is normalised jointly (LayerNorm, RMSNorm), added to a residual
stream, split into attention heads, or read by something unknown is refused, with the reason,
and so is a widening that would change a module used twice (called twice, or at two paths).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import PerforationError
from .blocks import CONV_TYPES
from .explicit_pairs import checked_pairs, explicit_entry
from .fx_follow import (
    LAST_AXIS,
    add_reader,
    module_at,
    pass_on_the_way,
    trace_model,
    traced,
    traced_in_blocks,
    unknown_reader,
)
from .known_blocks import known_blocks
from .layers import DendriticLayer
from .plan_types import (
    JOINT_NORMS,
    POOLING,
    LayerPlan,
    WideningPlan,
    axis_of,
    is_consumer,
    is_elementwise,
    is_grouped_conv,
    is_producer,
    is_width_exact,
    parametrized,
    refuse,
    width_of,
)

_LEAVES = "its output leaves the nn.Sequential"


def plan_widening(model: nn.Module, pairs: Mapping[str, Any] | None = None, *,
                  trace: bool = True) -> WideningPlan:
    """For every Linear/Conv/Conv1D layer (or dendritic layer over one) of ``model``: the
    consumers and pass-through modules a widening changes, or why it is refused.

    ``pairs``: ``{producer: [consumer, ...]}`` for layers the search cannot follow (a consumer
    after a flatten as ``(path, repeat)``). ``trace``: also try ``torch.fx``."""
    if not isinstance(model, nn.Module):
        raise PerforationError(f"plan_widening() takes an nn.Module, got {type(model).__name__}")
    candidates = _candidates(model)
    plan = WideningPlan({p: LayerPlan(p, False, "its consumers are unknown: it is not in an "
                                      "nn.Sequential chain or a known Transformer block; "
                                      "pass pairs={path: [consumers]}")
                         for p in candidates})
    decided: set[str] = set()
    for path in candidates:
        module = model.get_submodule(path)
        if is_grouped_conv(module) and path not in (pairs or {}):
            plan.layers[path] = refuse(path, _GROUPED.format(
                module.source.groups if isinstance(module, DendriticLayer) else module.groups),
                "grouped conv")
            decided.add(path)
    found: dict[str, LayerPlan] = {}  # what the search finds for a pairs= layer
    for path, readers in (pairs or {}).items():
        plan.layers[path] = explicit_entry(model, path, readers)
        decided.add(path)
    known_refusals: dict[str, LayerPlan] = {}  # what a known block rules out, pairs= or not
    for entry in known_blocks(model):
        if entry.path in decided:
            found.setdefault(entry.path, entry)
            if not entry.widenable and "residual stream" in (entry.reason or ""):
                known_refusals[entry.path] = entry
        if entry.path in plan.layers and entry.path not in decided:
            plan.layers[entry.path] = entry
            decided.add(entry.path)
    chained: set[str] = set()
    leaving: set[str] = set()
    for entry in _sequential_chains(model):
        if pairs and entry.path in pairs:
            found.setdefault(entry.path, entry)
        if entry.path in plan.layers and entry.path not in decided:
            plan.layers[entry.path] = entry
            if (entry.reason or "").startswith(_LEAVES):
                leaving.add(entry.path)
                continue  # the chain ends before its reader: the graph may still find it
            decided.add(entry.path)
            chained.add(entry.path)
    unchecked = {p for p in (pairs or {}) if p not in found and plan.layers[p].widenable}
    graph: torch.fx.Graph | Exception | None = None
    if trace and unchecked:
        graph = trace_model(model)
        if isinstance(graph, torch.fx.Graph):
            found.update({e.path: e for e in traced(model, unchecked, graph)})
        else:  # a block's own graph that finds the readers checks the entry as well
            found.update({e.path: e for e in traced_in_blocks(model, unchecked, graph)
                          if e.widenable})
    if trace and set(candidates) - decided | chained:
        graph = trace_model(model) if graph is None else graph
        whole = isinstance(graph, torch.fx.Graph)
        undecided = set(candidates) - decided
        entries = traced(model, undecided, graph) if whole else \
            traced_in_blocks(model, undecided, graph)  # the blocks' own graphs, where they trace
        for entry in entries:
            if entry.path in leaving and not whole and not entry.widenable:
                continue  # no graph found its reader: the chain's own reason says more
            plan.layers[entry.path] = entry
        if isinstance(graph, torch.fx.Graph):
            # a forward may also run a Sequential's steps one by one and keep their outputs:
            # where the model traces, the graph has the last word on a chain it would refuse
            wanted = {p for p in chained if plan.layers[p].widenable}
            for entry in traced(model, wanted, graph):
                if not entry.widenable:
                    plan.layers[entry.path] = entry
    for path, entry in found.items():
        if entry.widenable and entry.chunks > 1:  # a fused gate-and-up layer
            plan.layers[path] = refuse(path, f"{path}'s output is cut into {entry.chunks} parts "
                                             f"({entry.found_by}), which pairs= cannot say; "
                                             f"leave {path} out of pairs= and the block is "
                                             "found", "pairs")
        elif plan.layers[path].widenable and entry.widenable:
            plan.layers[path] = checked_pairs(model, plan.layers[path], entry)
    for path, entry in known_refusals.items():  # pairs= cannot undo a residual add
        plan.layers[path] = refuse(path, f"pairs= names its readers, but {entry.reason} "
                                         f"({entry.found_by})", "pairs")
    _refuse_shared(model, plan)
    return plan


_GROUPED = ("a grouped convolution (groups={}) cannot gain neurons of its own; a depthwise one "
            "gains channels with the layer that feeds it")


def _refuse_shared(model: nn.Module, plan: WideningPlan) -> None:
    """Refuse a widening that changes a module reachable at two paths of the model (one
    object used twice), a layer whose weight is tied to another module's, or a parametrized
    layer (its weight is computed): the other use, the tie or the parametrization would not
    follow the new neurons."""
    paths: dict[int, list[str]] = {}
    owners: dict[int, list[str]] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(path)
        for name, param in module.named_parameters(recurse=False):
            owners.setdefault(id(param), []).append(f"{path}.{name}" if path else name)
    for path, entry in plan.layers.items():
        if not entry.widenable:
            continue
        changed = [path, *entry.partners, *(p for p, _ in entry.consumers),
                   *(p for p, _ in entry.through)]
        for name in changed:
            why = _shared_reason(module_at(model, name), name, paths, owners)
            if why:
                plan.layers[path] = refuse(path, why, entry.found_by)
                break


def _shared_reason(module: Any, name: str, paths: Mapping[int, list[str]],
                   owners: Mapping[int, list[str]]) -> str | None:
    """Why widening through ``module`` (at ``name``) would break another use of it, or None."""
    if not isinstance(module, nn.Module) or is_width_exact(module):
        return None  # a function, or an activation exact on any width (relu)
    others = [p for p in paths.get(id(module), []) if p != name]
    if others and is_elementwise(module):
        return (f"{name} ({type(module).__name__}) is the same module as {others[0]}: a "
                "widening applies it block by block to stay exact, which one module shared by "
                "two uses cannot do; give each use its own module")
    if others:
        return f"{name} is the same module as {others[0]} (used twice): its other use would " \
               "change too"
    if parametrized(module):
        return (f"{name}'s weight is computed by a parametrization (weight_norm, "
                "spectral_norm, parametrize): it cannot gain rows or columns")
    inside = name + "."
    for param_path in (p for param in module.parameters()
                       for p in owners.get(id(param), [])):
        if not param_path.startswith(inside):
            return (f"{name} shares a parameter with {param_path} (tied weights): a widening "
                    "would untie them")
    return None


def _candidates(model: nn.Module) -> list[str]:
    inside: list[str] = []
    out = []
    for path, module in model.named_modules():
        if any(path.startswith(p + ".") for p in inside):
            continue
        if isinstance(module, DendriticLayer):
            inside.append(path)
        if path and (is_producer(module) or isinstance(module, (nn.Linear, *CONV_TYPES))):
            out.append(path)
    return out


def _sequential_chains(model: nn.Module) -> list[LayerPlan]:
    out = []
    for path, seq in model.named_modules():
        if not isinstance(seq, nn.Sequential):
            continue
        pre = f"{path}." if path else ""
        children = [step for name, child in seq.named_children()
                    for step in _conv_layer_steps(name, child)]
        for i, (name, child) in enumerate(children):
            if is_producer(child):
                out.append(_follow(pre, name, child, children[i + 1:], path))
    return out


def _conv_layer_steps(name: str, child: nn.Module) -> list[tuple[str, nn.Module]]:
    """A Sequential's child as the steps it runs: transformers' ``*ConvLayer`` modules (ResNet,
    MobileNet: convolution, then normalization and activation where present) open up, so a
    chain is followed through them; any other child is one step."""
    if not (type(child).__name__.endswith("ConvLayer")
            and isinstance(getattr(child, "convolution", None), nn.Module)):
        return [(name, child)]
    steps = [(f"{name}.{part}", getattr(child, part, None))
             for part in ("convolution", "normalization", "activation")]
    return [(path, module) for path, module in steps if isinstance(module, nn.Module)]


def _follow(pre: str, name: str, producer: nn.Module,
            rest: Sequence[tuple[str, nn.Module]], seq_path: str) -> LayerPlan:
    """Walk a Sequential from a producer to its consumer."""
    path, by = pre + name, "nn.Sequential"
    width, axis = width_of(producer, "out"), axis_of(producer)
    entry = LayerPlan(path, True, found_by=by)
    flat = False
    for child_name, child in rest:
        cpath = pre + child_name
        if axis == -1 and isinstance(child, (*POOLING, nn.Flatten)):
            return refuse(path, LAST_AXIS.format(cpath, type(child).__name__), by)
        if is_consumer(child):
            why = add_reader(entry, cpath, child, width, flat)
            return refuse(path, why, by) if why else entry
        passed, why = pass_on_the_way(entry, cpath, child, width, axis, flat)
        if why:
            return refuse(path, why, by)
        if passed:
            continue
        if isinstance(child, nn.Flatten):
            if child.start_dim != 1 or child.end_dim != -1:
                return refuse(path, f"{cpath} flattens dims {child.start_dim}..{child.end_dim}"
                                     "; only Flatten(1, -1) is followed", by)
            flat = True
        elif isinstance(child, JOINT_NORMS):
            return refuse(path, f"its outputs are normalised jointly by {cpath} "
                                 f"({type(child).__name__})", by)
        else:
            return refuse(path, unknown_reader(cpath, child), by)
    return refuse(path, f"{_LEAVES} {seq_path or '(model)'}, so its consumer is unknown "
                         "(and the model does not trace with torch.fx); pass pairs=", by)
