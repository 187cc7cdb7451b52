"""The feed-forward blocks of two Hugging Face vision models that do not trace with ``torch.fx``:
LeViT's MLP and PoolFormer's channel MLP. Their hidden layer gains neurons, its reader gains
zero input columns, and the reader (which writes the residual stream) is refused.

LeViT: ``linear_up`` (a Linear, then a BatchNorm1d over its outputs) -> ``activation`` ->
``linear_down`` (the same). The BatchNorm gains channels with neutral statistics. Its blocks
are checked by their parts (their classes, children and widths), as the model does not trace;
LeViT's attention projections (the same Linear-with-BatchNorm layers) are refused by name.

PoolFormer: ``conv1`` -> ``act_fn`` -> ``drop`` -> ``conv2`` -> ``drop`` (1x1 convs). The drop
path scales each sample by one random number, so it stays as it is at any width; the block
traces, so it is checked as the other known blocks are.
"""

from __future__ import annotations

from torch import nn

from .block_check import checked_block
from .blocks import BN_TYPES
from .plan_types import RESIDUAL, LayerPlan, is_producer, refuse, width_of

LEVIT = "LeViT MLP"
POOLFORMER = "PoolFormer MLP"
_LEVIT_ATTENTION = ("an attention projection: its outputs are split into heads or added to "
                    "the residual stream")


def vision_mlp(block: nn.Module, pre: str) -> list[LayerPlan] | None:
    """The plan entries of a LeViT MLP, a LeViT attention block or a PoolFormer MLP, or None
    when ``block`` is none of them."""
    kind = type(block).__name__
    if kind == "LevitMLPLayer":
        return _levit_mlp(block, pre)
    if kind.startswith("LevitAttention"):
        return [refuse(f"{pre}{name}.linear", _LEVIT_ATTENTION, LEVIT.replace("MLP", "attention"))
                for name, child in block.named_modules()
                if name and _linear_with_bn(child)]
    if kind == "PoolFormerOutput" and all(hasattr(block, n) for n in
                                          ("conv1", "act_fn", "drop", "conv2")):
        return [checked_block(block, pre, LayerPlan(
            pre + "conv1", True, consumers=[(pre + "conv2", 1)],
            through=[(pre + "act_fn", 1), (pre + "drop", 1)], found_by=POOLFORMER)),
            refuse(pre + "conv2", RESIDUAL, POOLFORMER)]
    return None


def _linear_with_bn(module: nn.Module) -> bool:
    """transformers' ``MLPLayerWithBN``: a Linear (plain or dendritic) and a BatchNorm of its
    outputs, nothing else."""
    children = dict(module.named_children())
    return type(module).__name__ == "MLPLayerWithBN" and set(children) == {
        "linear", "batch_norm"} and is_producer(children["linear"]) \
        and isinstance(children["batch_norm"], BN_TYPES)


def _levit_mlp(block: nn.Module, pre: str) -> list[LayerPlan]:
    leaves = refuse(pre + "linear_down.linear", RESIDUAL, LEVIT)
    path = pre + "linear_up.linear"
    children = dict(block.named_children())
    if set(children) != {"linear_up", "activation", "linear_down"} \
            or not all(_linear_with_bn(children[n]) for n in ("linear_up", "linear_down")):
        return [refuse(path, f"{pre.rstrip('.')} holds {sorted(children)}, not the LeViT MLP's "
                             "parts; pass pairs= if its readers are known", LEVIT), leaves]
    up, down, act = block.linear_up, block.linear_down, block.activation
    gives = width_of(up.linear, "out")
    if up.batch_norm.num_features != gives or width_of(down.linear, "in") != gives:
        return [refuse(path, f"{path} gives {gives} outputs, its BatchNorm has "
                             f"{up.batch_norm.num_features} and {pre}linear_down.linear reads "
                             f"{width_of(down.linear, 'in')}", LEVIT), leaves]
    if any(True for _ in act.parameters()) or any(True for _ in act.buffers()):
        return [refuse(path, f"{pre}activation ({type(act).__name__}) holds parameters",
                       LEVIT), leaves]
    return [LayerPlan(path, True, consumers=[(pre + "linear_down.linear", 1)],
                      through=[(pre + "linear_up.batch_norm", 1), (pre + "activation", -1)],
                      found_by=LEVIT), leaves]
