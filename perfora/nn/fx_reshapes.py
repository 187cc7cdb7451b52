"""Which ``torch.fx`` nodes flatten a tensor from dim 1 on, and which only ask its shape.

A CNN head often reads ``h.flatten(1)``, ``h.view(h.size(0), -1)`` or
``h.reshape(h.shape[0], -1)`` rather than ``torch.flatten(h, 1)``: all four keep the batch
axis and flatten the rest, so a widening follows them the same way. A shape query
(``h.size(0)``, ``h.shape``) carries no neuron values, so the plan need not follow it.
"""

from __future__ import annotations

import operator

import torch

_SHAPE_METHODS = {"size", "dim", "numel"}
_SHAPE_ATTRIBUTES = {"shape", "ndim", "dtype", "device", "is_cuda"}
_RESHAPE_METHODS = {"view", "reshape"}
_RESHAPE_FUNCTIONS = {torch.reshape}


def is_shape_query(node: torch.fx.Node) -> bool:
    """True where ``node`` reads a tensor's shape or type, not its values."""
    if node.op == "call_method":
        return node.target in _SHAPE_METHODS
    return (node.op == "call_function" and node.target is getattr
            and len(node.args) > 1 and node.args[1] in _SHAPE_ATTRIBUTES)


def _is_batch_size(arg: object) -> bool:
    """``x.size(0)``, ``x.shape[0]``, ``x.size()[0]`` or a literal batch size."""
    if isinstance(arg, int) and not isinstance(arg, bool):
        return arg > 0
    if not isinstance(arg, torch.fx.Node):
        return False
    if arg.op == "call_method" and arg.target == "size":
        return tuple(arg.args[1:]) == (0,) or arg.kwargs.get("dim") == 0
    if arg.op == "call_function" and arg.target is operator.getitem:
        source, index = arg.args
        return index == 0 and isinstance(source, torch.fx.Node) and (
            is_shape_query(source) and source.target in (getattr, "size"))
    return False


def _keeps_batch_flattens_rest(shape: tuple) -> bool:
    """A target shape ``(batch, -1)``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return len(shape) == 2 and shape[1] == -1 and _is_batch_size(shape[0])


def flattens_from_dim1(node: torch.fx.Node) -> bool:
    """True where ``node`` is ``torch.flatten(x, 1)``, ``x.flatten(1)``, ``x.view(batch, -1)``,
    ``x.reshape(batch, -1)`` or ``torch.reshape(x, (batch, -1))``."""
    if node.op == "call_function" and node.target is torch.flatten or \
            node.op == "call_method" and node.target == "flatten":
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
        return start == 1 and end == -1
    if node.op == "call_method" and node.target in _RESHAPE_METHODS:
        return _keeps_batch_flattens_rest(tuple(node.args[1:]))
    if node.op == "call_function" and node.target in _RESHAPE_FUNCTIONS:
        return _keeps_batch_flattens_rest(tuple(node.args[1:]))
    return False

