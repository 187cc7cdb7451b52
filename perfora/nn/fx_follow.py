"""Follow a layer's outputs through a ``torch.fx`` graph to its readers (step 4 of
:func:`perfora.nn.consumers.plan_widening`): through elementwise modules, dropout, pooling,
channel norms, depthwise convs, squeeze-excitation gates and flattening, to the Linear/Conv
layers that read them; refused, with the reason, at a residual add, a joint norm, a model
output or anything else.

Where the whole model does not trace (most Hugging Face models: their forwards branch on
their arguments), :func:`traced_in_blocks` traces the blocks around each layer instead, the
nearest first: a feed-forward block whose own forward traces (an MLP of two layers and an
activation) shows the layer's readers as well as the whole graph would, as long as the
layer's output stays inside the block.
"""

from __future__ import annotations

import inspect
import operator
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import CHANNEL_NORMS, BlockedLayer, BlockedNorm, Blockwise, is_hf_conv1d
from .fx_reshapes import flattens_from_dim1, is_shape_query, unfollowed_call
from .gates import gate_of
from .layers import DendriticLayer
from .norm_widening import norm_reason
from .plan_types import (
    DROPOUT,
    JOINT_NORMS,
    POOLING,
    LayerPlan,
    axis_of,
    grouped_reason,
    is_consumer,
    is_elementwise,
    is_grouped_conv,
    is_hf_activation,
    is_width_exact,
    refuse,
    width_of,
)

# functions that compute each element the same way whatever the tensor's width
_EXACT_FUNCTIONS = {F.relu, torch.relu, F.relu6, F.hardtanh, F.max_pool1d, F.max_pool2d,
                    F.max_pool3d}
_POOL_FUNCTIONS = {F.max_pool1d, F.max_pool2d, F.max_pool3d}
_EXACT_METHODS = {"relu", "relu_"}
# dropout: exact in eval (in training its mask, random either way, covers the wider tensor)
_EXACT_FUNCTIONS |= {F.dropout, torch.dropout}
LAST_AXIS = ("a Linear's neurons are on the last axis of its output, and {0} ({1}) works on "
             "dim 1, the same axis only when the output is 2-D, which the plan cannot know")
MODEL_OUTPUT = "its output is an output of the model (its width is the model's output size)"
_ADDS = {operator.add, operator.iadd, torch.add, operator.sub, torch.sub}


class _LeafTracer(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        # perfora's own modules, and the widened (blocked) forms of torch's, are leaves as
        # the torch modules they stand for are: followed by type, never traced into
        return isinstance(m, DendriticLayer | Blockwise | BlockedLayer | BlockedNorm) \
            or is_hf_conv1d(m) or is_hf_activation(m) or super().is_leaf_module(m, qualname)


def trace_model(model: nn.Module) -> torch.fx.Graph | Exception:
    """The model's torch.fx graph, or why it does not trace."""
    try:
        return _LeafTracer().trace(model)
    except Exception as exc:  # noqa: BLE001 - any trace failure means: fx cannot tell
        return exc


def traced(model: nn.Module, wanted: set[str],
           graph: torch.fx.Graph | Exception) -> list[LayerPlan]:
    """Follow each wanted producer's output through the model's torch.fx ``graph``."""
    if not isinstance(graph, torch.fx.Graph):
        reason = (f"not in an nn.Sequential chain or a known block, and torch.fx cannot trace "
                  f"the model ({type(graph).__name__}); pass pairs=")
        return [refuse(p, reason, "torch.fx") for p in sorted(wanted)]
    calls = Counter(str(node.target) for node in graph.nodes if node.op == "call_module")
    out, done = [], set()
    for node in graph.nodes:
        target = str(node.target)
        if node.op != "call_module" or target not in wanted or target in done:
            continue
        done.add(target)
        if calls[target] > 1:
            out.append(refuse(target, f"it is called {calls[target]} times (its weights are "
                                       "shared by those calls), so its readers cannot be "
                                       "widened apart; pass pairs= if they can", "torch.fx"))
            continue
        entry = follow_graph(model, node)
        # a dropout called again elsewhere (after the reader, as many MLPs do) stays as it is:
        # exact in eval mode, and in training its mask covers the wider tensor
        entry.through = [(p, a) for p, a in entry.through if calls[p] < 2
                         or not isinstance(module_at(model, p), DROPOUT)]
        # a shared relu is fine: a widening leaves it as it is
        shared = [p for p, _ in [*entry.consumers, *entry.through] if calls[p] > 1
                  and not is_width_exact(module_at(model, p))]
        if entry.widenable and shared:
            fix = "; give each call its own module" if is_elementwise(
                module_at(model, shared[0])) else ""
            entry = refuse(target, f"its output goes to {shared[0]}, which is called "
                                    f"{calls[shared[0]]} times: its other calls' inputs would "
                                    f"not widen{fix}", "torch.fx")
        out.append(entry)
    return out


def after_flatten(path: str, module: nn.Module) -> str | None:
    """Why a widening stops at ``module`` after a flatten, or None where it stays as it is:
    relu-like modules are exact on any width, and so is dropout in eval mode (in training
    its mask, random either way, is drawn over the wider tensor). Anything else would have
    to be split by neuron in the flattened layout, which a widening does not do."""
    if is_width_exact(module) or isinstance(module, DROPOUT):
        return None
    return (f"its output is flattened and then goes through {path} "
            f"({type(module).__name__}), which a widening splits by neuron only before a "
            "flatten")


def add_reader(entry: LayerPlan, path: str, module: nn.Module, width: int,
               flat: bool) -> str | None:
    """Add the Linear/Conv at ``path`` to ``entry``'s readers (after a flatten, with the
    spatial size as its repeat); else why not."""
    have = width_of(module, "in")
    if have % width or (not flat and have != width):
        return f"{path} reads {have} inputs, not a multiple of its {width} outputs"
    entry.consumers.append((path, have // width))
    return None


def pass_on_the_way(entry: LayerPlan, path: str, module: nn.Module, width: int, axis: int,
                    flat: bool) -> tuple[bool, str | None]:
    """(whether a widening passes ``module``, why not): a depthwise conv (it gains channels),
    a channel norm (neutral channels), an elementwise module, dropout or pooling (applied
    block by block; after a flatten only those exact on any width). One passed is put among
    ``entry``'s modules on the way; (False, None) for any other module."""
    if is_grouped_conv(module):
        return True, pass_depthwise(entry, path, module, width, axis, flat)
    if isinstance(module, CHANNEL_NORMS):
        why = norm_reason(module, path, width, "the layer")
        if why is None:
            entry.through.append((path, 1))
        return True, why
    if is_elementwise(module) or isinstance(module, (*DROPOUT, *POOLING)):
        if flat:
            return True, after_flatten(path, module)
        if not isinstance(module, nn.Identity):
            entry.through.append((path, axis))
        return True, None
    return False, None


def pass_depthwise(entry: LayerPlan, path: str, module: nn.Module, width: int, axis: int,
                   flat: bool) -> str | None:
    """Put the grouped conv at ``path`` among ``entry``'s modules on the way, where it is a
    depthwise conv a widening passes through; else why not."""
    why = grouped_reason(path, module, width, axis, flat)
    if why is None:
        entry.through.append((path, axis))
    return why


def unknown_reader(path: str, module: nn.Module) -> str:
    """Why a widening stops at ``module``: its use of new neurons is unknown."""
    return (f"its output goes to {path} ({type(module).__name__}), whose use of new neurons "
            "is unknown; pass pairs=")


def follow_graph(model: nn.Module, start: torch.fx.Node) -> LayerPlan:
    path, by = str(start.target), "torch.fx"
    producer = model.get_submodule(path)
    width, axis = width_of(producer, "out"), axis_of(producer)
    entry = LayerPlan(path, True, found_by=by)
    todo = [(user, False) for user in start.users]
    seen: set[str] = set()
    while todo:
        node, flat = todo.pop()
        if node.name in seen:
            continue
        seen.add(node.name)
        nxt = [(user, flat) for user in node.users]
        if node.op == "call_module":
            module = model.get_submodule(str(node.target))
            target = str(node.target)
            if axis == -1 and isinstance(module, (*POOLING, nn.Flatten)):
                return refuse(path, LAST_AXIS.format(target, type(module).__name__), by)
            if is_consumer(module):
                why = add_reader(entry, target, module, width, flat)
                if why:
                    return refuse(path, why, by)
                continue
            passed, why = pass_on_the_way(entry, target, module, width, axis, flat)
            if why:
                return refuse(path, why, by)
            if passed:
                pass  # on the way: followed on
            elif isinstance(module, nn.Flatten) and module.start_dim == 1 \
                    and module.end_dim == -1:
                nxt = [(user, True) for user in node.users]
            elif isinstance(module, JOINT_NORMS):
                return refuse(path, f"its outputs are normalised jointly by {target} "
                                     f"({type(module).__name__})", by)
            else:
                return refuse(path, unknown_reader(target, module), by)
        elif (gate := gate_of(model, node, width, seen)) is not None:
            # a squeeze-excitation product: its gate gains a gate per new channel
            entry.partners.append(gate.expand)
            entry.through.append((gate.activation, axis))
        elif node.op == "call_function" and node.target in _ADDS:
            return refuse(path, f"its output is added to another tensor ({node.name}): a "
                                 "residual connection", by)
        elif is_shape_query(node):  # x.size(0), x.shape: no neuron values flow on
            nxt = []
        elif axis == -1 and (flattens_from_dim1(node) or node.op == "call_function"
                             and node.target in (torch.flatten, *_POOL_FUNCTIONS)):
            return refuse(path, LAST_AXIS.format(
                node.name, getattr(node.target, "__name__", node.target)), by)
        elif flattens_from_dim1(node):  # flatten(1), view(x.size(0), -1), reshape(...)
            nxt = [(user, True) for user in node.users]
        elif node.op == "output":  # its width is the model's: no pairs= can change that
            return refuse(path, MODEL_OUTPUT, by)
        elif not (node.op == "call_function" and node.target in _EXACT_FUNCTIONS
                  or node.op == "call_method" and node.target in _EXACT_METHODS):
            return refuse(path, unfollowed_call(node), by)
        todo.extend(nxt)
    if not entry.consumers:
        return refuse(path, "no Linear/Conv consumer reads its output", by)
    return entry


def module_at(model: nn.Module, path: str) -> Any:
    """The module (or function attribute, e.g. a Transformer block's activation) at ``path``."""
    parent, _, attr = path.rpartition(".")
    return getattr(model.get_submodule(parent) if parent else model, attr, None)


BLOCK_DEPTH = 3
"""How many enclosing modules :func:`traced_in_blocks` tries for a layer, the nearest first."""


def traced_in_blocks(model: nn.Module, wanted: set[str],
                     whole: Exception) -> list[LayerPlan]:
    """Each wanted layer followed through the graph of the nearest enclosing module (at most
    :data:`BLOCK_DEPTH` levels up) whose forward takes one input, traces and keeps the layer's
    output inside it; refused where none does, with the reason the whole model (``whole``)
    gave or the block the output leaves. A block's graph is as good as the model's for such a
    layer: its output reaches nothing outside the block, and only its readers' inputs
    widen."""
    graphs: dict[str, torch.fx.Graph | Exception] = {}
    fallback = traced(model, wanted, whole)  # the refusals, one per layer
    return [_in_blocks(model, entry.path, graphs) or entry for entry in fallback]


def _in_blocks(model: nn.Module, path: str,
               graphs: dict[str, torch.fx.Graph | Exception]) -> LayerPlan | None:
    parts = path.split(".")
    left: str | None = None  # the largest traced block the output leaves
    for up in range(1, min(BLOCK_DEPTH, len(parts) - 1) + 1):
        block_path = ".".join(parts[:-up])
        block = model.get_submodule(block_path)
        if block_path not in graphs:
            graphs[block_path] = trace_model(block) if _one_input(block) else \
                TypeError("its forward takes more than one input")
        graph = graphs[block_path]
        if not isinstance(graph, torch.fx.Graph):
            continue
        found = traced(block, {".".join(parts[-up:])}, graph)
        if not found:
            continue  # the block's forward does not call the layer
        if found[0].reason == MODEL_OUTPUT:
            left = f"{block_path} ({type(block).__name__})"
            continue  # its reader is further out
        return _prefixed(found[0], block_path, type(block).__name__)
    if left is None:
        return None
    return refuse(path, f"its output leaves {left}, whose forward traces with torch.fx, and "
                        "the modules around it do not trace; pass pairs=", "torch.fx")


def _one_input(block: nn.Module) -> bool:
    """True when the block's forward takes exactly one input and nothing else: a graph traced
    with a placeholder for an optional argument takes the branch of an argument that is given
    (``if mask is None`` is False for it), which a call without it does not run."""
    try:
        params = list(inspect.signature(block.forward).parameters.values())
    except (TypeError, ValueError):  # no signature to read
        return False
    return len(params) == 1 and params[0].default is inspect.Parameter.empty \
        and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                               inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _prefixed(entry: LayerPlan, block_path: str, kind: str) -> LayerPlan:
    """``entry``, found in the block at ``block_path``, with the model's paths."""
    pre = block_path + "."
    return LayerPlan(pre + entry.path, entry.widenable, entry.reason,
                     consumers=[(pre + p, r) for p, r in entry.consumers],
                     through=[(pre + p, a) for p, a in entry.through],
                     partners=[pre + p for p in entry.partners],
                     found_by=f"torch.fx ({kind})", chunks=entry.chunks)
