"""Check a feed-forward block recognised by its attribute names against what it computes.

``fc1``/``fc2`` or ``gate_proj``/``up_proj``/``down_proj`` are common names, and some blocks
that use them do more between the two layers (a norm, a top-k over the hidden width, a chunk
into halves). Such a block would change its output, or fail, once widened. So a known block is
widened only when its widths agree, it holds no other module with state, and, where it traces
with ``torch.fx``, its hidden layer's output reaches the consumer through the activation (and,
in a gated block, the product with its partner) and nothing else.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from .plan_types import LayerPlan, refuse, width_of

_PRODUCTS = {operator.mul, torch.mul}
_PASS_FUNCTIONS = {F.dropout}
_ITEM = operator.getitem


class _ChildrenAsLeaves(torch.fx.Tracer):
    """Traces only the block's own forward: every submodule is one node."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return True


def checked_block(block: nn.Module, pre: str, entry: LayerPlan,
                  upstream: tuple[str, ...] = ()) -> LayerPlan:
    """``entry`` (a known block's pair, paths prefixed by ``pre``), or its refusal when the
    block does not compute what its names suggest. ``upstream`` names children with state that
    the pattern has before the pair (ConvNeXt's depthwise conv and norm)."""
    graph = _traced(block)
    why = _mismatch(block, pre, entry, set(upstream), graph)
    if why is None and graph is None and entry.chunks > 1:
        # only the graph shows that the output is cut in halves, not interleaved, say
        return refuse(entry.path, f"the block does not trace with torch.fx, so how it cuts "
                                  f"{entry.path}'s output into {entry.chunks} parts is not "
                                  "known", entry.found_by)
    if why is None:
        return entry
    hint = "" if entry.chunks > 1 else "; pass pairs= if its readers are known"
    return refuse(entry.path, f"{why}, which the {entry.found_by} pattern does not have{hint}",
                  entry.found_by)


def _local(pre: str, path: str) -> str:
    return path[len(pre):]


def _traced(block: nn.Module) -> torch.fx.Graph | None:
    """The block's own forward as a graph of its children, or None where it does not trace."""
    try:
        return _ChildrenAsLeaves().trace(block)
    except Exception:  # noqa: BLE001 - any failure to trace
        return None


def _mismatch(block: nn.Module, pre: str, entry: LayerPlan, upstream: set[str],
              graph: torch.fx.Graph | None) -> str | None:
    producers = [_local(pre, p) for p in [entry.path, *entry.partners]]
    consumer = _local(pre, entry.consumers[0][0])
    through = {_local(pre, p) for p, _ in entry.through}
    reads = width_of(block.get_submodule(consumer), "in")
    for name in producers:
        gives = width_of(block.get_submodule(name), "out")
        if gives != reads * entry.chunks:
            return f"{pre}{name} gives {gives} outputs and {pre}{consumer} reads {reads}"
    roles = {*producers, consumer, *through, *upstream}
    for name, child in block.named_children():
        if name not in roles and (any(True for _ in child.parameters())
                                  or any(True for _ in child.buffers())):
            return f"the block also holds {pre}{name} ({type(child).__name__})"
    if graph is None:
        return None  # an untraceable block is judged by names and widths
    for name in producers:
        why = _path_to_consumer(graph, name, consumer, through,
                                gated=len(producers) > 1 or entry.chunks > 1,
                                chunks=entry.chunks)
        if why:
            return f"{pre}{name}'s output {why}"
    return None


def _path_to_consumer(graph: torch.fx.Graph, name: str, consumer: str, through: set[str],
                      gated: bool, chunks: int = 1) -> str | None:
    """Why ``name``'s output does not go only to ``consumer`` (through ``through`` and, when
    ``gated``, a product; when ``chunks`` > 1, a ``chunk`` into that many parts on the last
    axis and its items), or None."""
    calls = [n for n in graph.nodes if n.op == "call_module" and n.target == name]
    if len(calls) != 1:
        return f"is computed {len(calls)} times"
    todo, reached = list(calls[0].users), False
    while todo:
        node = todo.pop()
        if node.op == "call_module" and node.target == consumer:
            reached = True
            continue
        passes = (node.op == "call_module" and node.target in through
                  or node.op == "call_function" and (node.target in _PASS_FUNCTIONS
                                                     or gated and node.target in _PRODUCTS
                                                     or chunks > 1 and node.target is _ITEM)
                  or chunks > 1 and _chunks_last_axis(node, chunks))
        if not passes:
            what = "the block's output" if node.op == "output" else \
                f"{getattr(node.target, '__name__', node.target)} ({node.op})"
            return f"also goes to {what}"
        todo.extend(node.users)
    return None if reached else f"does not reach {consumer}"


def _chunks_last_axis(node: torch.fx.Node, chunks: int) -> bool:
    """True for ``t.chunk(chunks, dim=-1)`` (or ``torch.chunk``) on the layer's output."""
    if not (node.op == "call_method" and node.target == "chunk"
            or node.op == "call_function" and node.target is torch.chunk):
        return False
    args = list(node.args[1:]) + [None, None]
    count = node.kwargs.get("chunks", args[0])
    dim = node.kwargs.get("dim", args[1] if args[1] is not None else 0)
    return count == chunks and dim == -1
