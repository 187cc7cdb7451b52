"""The inverted residual blocks of Hugging Face's MobileNetV2 and MobileViT: the expansion
conv gains channels, the depthwise conv after it gains channels of its own, and the
projection conv reads them through zero columns.

Such a block calls three ``*ConvLayer`` modules in turn (``expand_1x1``, ``conv_3x3``,
``reduce_1x1``; each a conv, then BatchNorm and an activation where present), and its forward
is not an ``nn.Sequential`` and does not trace with ``torch.fx``, so the search knows it by
its names, checked against its widths. The stem of MobileNetV2 has the same three layers
after its first conv (whose output is the one that widens when it has no ``expand_1x1``).
"""

from __future__ import annotations

from torch import nn

from .blocks import BN_TYPES
from .plan_types import (
    LayerPlan,
    axis_of,
    grouped_reason,
    is_producer,
    refuse,
    width_of,
)

FOUND_BY = "MobileNet inverted residual"
_PARTS = ("convolution", "normalization", "activation")


def inverted_residual(block: nn.Module, pre: str) -> list[LayerPlan] | None:
    """The plan entries of one inverted residual block (its expansion pair, and the
    projection's refusal), or None when ``block`` is not one."""
    if not type(block).__name__.endswith(("InvertedResidual", "Stem")):
        return None
    convs = {name: getattr(block, name, None) for name in ("expand_1x1", "conv_3x3",
                                                             "reduce_1x1", "first_conv")}
    if not all(_conv_layer(convs[n]) for n in ("conv_3x3", "reduce_1x1")):
        return None
    name = "expand_1x1" if _conv_layer(convs["expand_1x1"]) else "first_conv"
    if not _conv_layer(convs[name]):
        return None
    path = f"{pre}{name}.convolution"
    producer = convs[name].convolution
    leaves = refuse(f"{pre}reduce_1x1.convolution", "its output leaves the block (added to "
                    "the residual stream, or read by the next block); pass pairs=", FOUND_BY)
    if not is_producer(producer):
        return [leaves]
    return [_entry(block, pre, path, name, producer), leaves]


def _entry(block: nn.Module, pre: str, path: str, name: str,
           producer: nn.Module) -> LayerPlan:
    width, axis = width_of(producer, "out"), axis_of(producer)
    through: list[tuple[str, int]] = []
    for layer in (name, "conv_3x3"):
        parts = {part: getattr(getattr(block, layer), part, None) for part in _PARTS}
        if layer == "conv_3x3":
            why = grouped_reason(f"{pre}conv_3x3.convolution", parts["convolution"], width,
                                 axis, False)
            if why:
                return refuse(path, why, FOUND_BY)
            through.append((f"{pre}conv_3x3.convolution", axis))
        norm, act = parts["normalization"], parts["activation"]
        if norm is not None:
            if not isinstance(norm, BN_TYPES) or norm.num_features != width:
                return refuse(path, f"{pre}{layer}.normalization is not a BatchNorm of its "
                                    f"{width} channels", FOUND_BY)
            through.append((f"{pre}{layer}.normalization", 1))
        if act is not None:
            through.append((f"{pre}{layer}.activation", axis))
    reader = block.reduce_1x1.convolution
    if width_of(reader, "in") != width:
        return refuse(path, f"{pre}reduce_1x1.convolution reads {width_of(reader, 'in')} "
                            f"channels, not its {width}", FOUND_BY)
    return LayerPlan(path, True, consumers=[(f"{pre}reduce_1x1.convolution", 1)],
                     through=through, found_by=FOUND_BY)


def _conv_layer(module: nn.Module | None) -> bool:
    """A transformers ``*ConvLayer``: a conv (plain or dendritic) with optional norm and
    activation, applied in that order."""
    return module is not None and type(module).__name__.endswith("ConvLayer") \
        and isinstance(getattr(module, "convolution", None), nn.Module)
