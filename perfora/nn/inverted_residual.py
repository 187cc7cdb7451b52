"""The inverted residual blocks of Hugging Face's MobileNetV2, MobileViT and EfficientNet: the
expansion conv gains channels, the depthwise conv after it gains channels of its own, and the
projection conv reads them through zero columns.

A MobileNetV2 or MobileViT block calls three ``*ConvLayer`` modules in turn (``expand_1x1``,
``conv_3x3``, ``reduce_1x1``; each a conv, then BatchNorm and an activation where present).
Their forwards are not ``nn.Sequential`` chains and do not trace with ``torch.fx``, so the
search knows them by their names, checked against their widths. The stem of MobileNetV2 has
the same three layers after its first conv (whose output is the one that widens when it has no
``expand_1x1``). An EfficientNet block also scales the depthwise conv's output by a
squeeze-excitation gate, ``h * sigmoid(expand(act(reduce(pool(h)))))``: its ``reduce`` conv
reads the new channels through zero columns (the gate of the old channels is unchanged), its
``expand`` conv gains a gate for each new channel (random rows, zero bias), and the product's
new channels reach the projection's zero columns.
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
EFFICIENTNET = "EfficientNet block"
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


MOBILENET_V1 = "MobileNetV1 layers"


def mobilenet_v1_layers(model: nn.Module, pre: str) -> list[LayerPlan] | None:
    """The plan entries of a transformers ``MobileNetV1Model`` (``conv_stem``, then ``layer``: a
    ModuleList of ``*ConvLayer`` modules, depthwise and pointwise in turn, which its forward
    runs in order): each pointwise conv (and the stem) widens through the depthwise layer after
    it to the next pointwise conv; the last one's output is the model's. None for other
    modules."""
    layers = getattr(model, "layer", None)
    if type(model).__name__ != "MobileNetV1Model" or not isinstance(layers, nn.ModuleList) \
            or not _conv_layer(getattr(model, "conv_stem", None)) \
            or not all(_conv_layer(m) for m in layers) or len(layers) % 2:
        return None
    names = ["conv_stem", *(f"layer.{i}" for i in range(len(layers)))]
    out = []
    for i in range(0, len(names), 2):  # the stem and each pointwise layer
        producer = names[i]
        path = f"{pre}{producer}.convolution"
        if i + 2 >= len(names):
            out.append(refuse(path, "its output is the model's last hidden state",
                              MOBILENET_V1))
            continue
        depthwise = names[i + 1]
        reader = model.get_submodule(f"{names[i + 2]}.convolution")
        conv = model.get_submodule(f"{producer}.convolution")
        if not is_producer(conv):
            continue
        width, axis = width_of(conv, "out"), axis_of(conv)
        why = grouped_reason(f"{pre}{depthwise}.convolution",
                             model.get_submodule(f"{depthwise}.convolution"), width, axis, False)
        through: list[tuple[str, int]] = []
        for name in (producer, depthwise):
            layer = model.get_submodule(name)
            norm, act = getattr(layer, "normalization", None), getattr(layer, "activation", None)
            if name == depthwise:
                through.append((f"{pre}{depthwise}.convolution", axis))
            if norm is not None:
                if why is None and (not isinstance(norm, BN_TYPES) or norm.num_features != width):
                    why = f"{pre}{name}.normalization is not a BatchNorm of its {width} channels"
                through.append((f"{pre}{name}.normalization", 1))
            if isinstance(act, nn.Module):
                through.append((f"{pre}{name}.activation", axis))
        if why is None and width_of(reader, "in") != width:
            why = f"{pre}{names[i + 2]}.convolution reads {width_of(reader, 'in')} channels"
        out.append(refuse(path, why, MOBILENET_V1) if why else LayerPlan(
            path, True, consumers=[(f"{pre}{names[i + 2]}.convolution", 1)], through=through,
            found_by=MOBILENET_V1))
    return out


def _conv_layer(module: nn.Module | None) -> bool:
    """A transformers ``*ConvLayer``: a conv (plain or dendritic) with optional norm and
    activation, applied in that order."""
    return module is not None and type(module).__name__.endswith("ConvLayer") \
        and isinstance(getattr(module, "convolution", None), nn.Module)


_EFFICIENTNET_PARTS = ("expansion.expand_conv", "expansion.expand_bn", "expansion.expand_act",
                       "depthwise_conv.depthwise_conv_pad", "depthwise_conv.depthwise_conv",
                       "depthwise_conv.depthwise_norm", "depthwise_conv.depthwise_act",
                       "squeeze_excite.squeeze", "squeeze_excite.reduce",
                       "squeeze_excite.act_reduce", "squeeze_excite.expand",
                       "squeeze_excite.act_expand", "projection.project_conv")


def efficientnet_block(block: nn.Module, pre: str) -> list[LayerPlan] | None:
    """The plan entries of one transformers EfficientNet block with an expansion (its
    expansion conv with the squeeze-excitation gate, and the projection's refusal), or None
    when ``block`` is not one."""
    parts = {name: _get(block, name) for name in _EFFICIENTNET_PARTS}
    if not type(block).__name__.endswith("Block") or any(p is None for p in parts.values()):
        return None
    path = f"{pre}expansion.expand_conv"
    leaves = refuse(f"{pre}projection.project_conv", "its output leaves the block (added to "
                    "the residual stream, or read by the next block); pass pairs=",
                    EFFICIENTNET)
    producer, gate = parts["expansion.expand_conv"], parts["squeeze_excite.expand"]
    if not (is_producer(producer) and is_producer(gate)):
        return [leaves]
    width, axis = width_of(producer, "out"), axis_of(producer)
    why = grouped_reason(f"{pre}depthwise_conv.depthwise_conv",
                         parts["depthwise_conv.depthwise_conv"], width, axis, False)
    for norm in ("expansion.expand_bn", "depthwise_conv.depthwise_norm"):
        module = parts[norm]
        if why is None and (not isinstance(module, BN_TYPES) or module.num_features != width):
            why = f"{pre}{norm} is not a BatchNorm of its {width} channels"
    sizes = {"squeeze_excite.reduce": width_of(parts["squeeze_excite.reduce"], "in"),
             "squeeze_excite.expand": width_of(gate, "out"),
             "projection.project_conv": width_of(parts["projection.project_conv"], "in")}
    for name, size in sizes.items():
        if why is None and size != width:
            why = f"{pre}{name} has {size} channels where its output has {width}"
    if why:
        return [refuse(path, why, EFFICIENTNET), leaves]
    through = [(f"{pre}{name}", 1 if name.endswith(("_bn", "_norm")) else axis)
               for name in ("expansion.expand_bn", "expansion.expand_act",
                            "depthwise_conv.depthwise_conv_pad", "depthwise_conv.depthwise_conv",
                            "depthwise_conv.depthwise_norm", "depthwise_conv.depthwise_act",
                            "squeeze_excite.squeeze", "squeeze_excite.act_expand")]
    return [LayerPlan(path, True, consumers=[(f"{pre}projection.project_conv", 1),
                                             (f"{pre}squeeze_excite.reduce", 1)],
                      through=through, partners=[f"{pre}squeeze_excite.expand"],
                      found_by=EFFICIENTNET), leaves]


def _get(module: nn.Module, dotted: str) -> nn.Module | None:
    for name in dotted.split("."):
        module = getattr(module, name, None)
        if module is None:
            return None
    return module if isinstance(module, nn.Module) else None
