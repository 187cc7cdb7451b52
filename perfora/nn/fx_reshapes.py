"""Which ``torch.fx`` nodes flatten a tensor from dim 1 on, which only ask its shape, and
what to tell a user whose model calls something a widening cannot follow.

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



_MODULE_FORMS = {"gelu": "nn.GELU()", "silu": "nn.SiLU()", "tanh": "nn.Tanh()",
                 "sigmoid": "nn.Sigmoid()", "leaky_relu": "nn.LeakyReLU()", "elu": "nn.ELU()",
                 "mish": "nn.Mish()", "softplus": "nn.Softplus()", "hardswish": "nn.Hardswish()",
                 "adaptive_avg_pool1d": "nn.AdaptiveAvgPool1d(...)",
                 "adaptive_avg_pool2d": "nn.AdaptiveAvgPool2d(...)",
                 "adaptive_avg_pool3d": "nn.AdaptiveAvgPool3d(...)",
                 "avg_pool1d": "nn.AvgPool1d(...)", "avg_pool2d": "nn.AvgPool2d(...)",
                 "avg_pool3d": "nn.AvgPool3d(...)", "adaptive_max_pool2d":
                 "nn.AdaptiveMaxPool2d(...)", "mean": "nn.AdaptiveAvgPool2d(1) (a mean over "
                 "the spatial axes)"}
_RESHAPES = {"view", "reshape", "flatten", "squeeze", "unsqueeze"}


def unfollowed_call(node: torch.fx.Node) -> str:
    """Why a widening stops at the function or method ``node``, and what to write instead."""
    name = getattr(node.target, "__name__", str(node.target))
    what = f"its output goes to {name} ({node.op}), which a widening cannot follow"
    if name in _RESHAPES or node.target in (torch.reshape, torch.flatten, torch.squeeze):
        return (f"{what}: of the reshapes only a flatten that keeps the batch axis is "
                "followed (x.flatten(1), x.view(x.size(0), -1)); a shape with a fixed width "
                "would not fit the wider tensor; pass pairs= if its readers are known")
    if name in _MODULE_FORMS:
        return (f"{what}: as a function it cannot run block by block (its last bits on the "
                f"wider tensor may differ); use the module form, {_MODULE_FORMS[name]}, "
                "which a widening follows, or pass pairs= if a last-bit change is acceptable")
    return (f"{what} (elementwise modules, relu, max pooling, dropout and flattening are "
            "followed); pass pairs=")
