"""Squeeze-excitation gates in a ``torch.fx`` graph: ``h * act(fc2(act(fc1(pool(h)))))``, as
torchvision's ``SqueezeExcitation`` computes it (MobileNetV3, EfficientNet, RegNet-Y).

When a widened layer's output ``h`` reaches such a product, the widening can go on through it:
``fc1`` reads the pooled new channels through zero columns (so the old channels' gates are
unchanged), ``fc2`` gains a gate for each new channel (random rows, zero bias: a partner of the
producer), the gate's activation is applied block by block, and the product's new channels
go on to the reader. :func:`gate_of` recognises the pattern at the product's node.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import nn

from .blocks import CONV_TYPES
from .layers import DendriticLayer
from .plan_types import DROPOUT, ELEMENTWISE, POOLING, is_producer, width_of

PRODUCTS = {operator.mul, torch.mul}


@dataclass
class Gate:
    """The modules of one squeeze-excitation gate (paths in the model)."""

    squeeze: str  # the pooling layer
    reduce: str  # fc1: gains zero input columns
    expand: str  # fc2: gains a gate per new channel
    activation: str  # the gate's own activation (sigmoid, hardsigmoid), applied block by block


def gate_of(model: nn.Module, product: torch.fx.Node, width: int,
            visited: set[str]) -> Gate | None:
    """The gate at ``product`` (a node the widened path of ``width`` channels reached; the
    path's nodes so far by name in ``visited``), or None when ``product`` is not a
    squeeze-excitation product of that path's tensor (a path that came through the gate
    itself scales nothing new)."""
    if product.op != "call_function" or product.target not in PRODUCTS \
            or len(product.args) != 2 or product.kwargs:
        return None
    for scaled, gate in (product.args, product.args[::-1]):
        if isinstance(scaled, torch.fx.Node) and isinstance(gate, torch.fx.Node) \
                and gate.name not in visited:
            found = _gate(model, scaled, gate, width)
            if found is not None:
                return found
    return None


def _gate(model: nn.Module, scaled: torch.fx.Node, gate: torch.fx.Node,
          width: int) -> Gate | None:
    chain = _modules_back(model, gate, 5)
    if chain is None:
        return None
    (act, act_m), (fc2, fc2_m), (mid, mid_m), (fc1, fc1_m), (pool, pool_m) = chain
    if not (isinstance(act_m, ELEMENTWISE) and isinstance(mid_m, ELEMENTWISE + DROPOUT)
            and isinstance(pool_m, POOLING) and is_producer(fc1_m) and is_producer(fc2_m)):
        return None
    first = [n for n in gate.graph.nodes if n.op == "call_module" and n.target == pool]
    if len(first) != 1 or first[0].args[:1] != (scaled,):
        return None  # the gate must be computed from the very tensor it scales
    if not all(isinstance(_core(m), CONV_TYPES) for m in (fc1_m, fc2_m)) \
            or width_of(fc1_m, "in") != width or width_of(fc2_m, "out") != width:
        return None  # 1x1 convs over the pooled channels, as torchvision's
    return Gate(squeeze=pool, reduce=fc1, expand=fc2, activation=act)


def _modules_back(model: nn.Module, node: torch.fx.Node,
                  count: int) -> list[tuple[str, nn.Module]] | None:
    """The ``count`` modules called one after another up to ``node`` (newest first), each
    read only by the next; None where the chain is anything else."""
    out: list[tuple[str, nn.Module]] = []
    while len(out) < count:
        if node.op != "call_module" or len(node.args) != 1 or node.kwargs \
                or not isinstance(node.args[0], torch.fx.Node) \
                or (out and len(node.users) != 1):
            return None
        target = str(node.target)
        out.append((target, model.get_submodule(target)))
        node = node.args[0]
    return out


def _core(module: nn.Module) -> nn.Module:
    return module.source if isinstance(module, DendriticLayer) else module
