"""Channel norms between a widened layer and its readers: BatchNorm, InstanceNorm, GroupNorm.

Each gains the k new channels with neutral affine parameters (weight 1, bias 0) and neutral
running statistics (mean 0, variance 1) where it keeps them, and normalises them apart from
the old ones (block by block, see :mod:`perfora.nn.blocks`), so the old channels' outputs
keep every bit. A GroupNorm gains whole groups of its group size, so a layer it follows
gains neurons in multiples of that size; a narrowing gives the same channels back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import PerforationError
from .blocks import CHANNEL_NORMS, make_blocked, unblock_if_whole, without_last_block

if TYPE_CHECKING:
    from .plan_types import LayerPlan

_PER_CHANNEL = ("weight", "bias", "running_mean", "running_var")
_OWN_CALLS = ((nn.modules.batchnorm._BatchNorm, ("forward",)),
              (nn.modules.instancenorm._InstanceNorm, ("forward", "_apply_instance_norm")),
              (nn.GroupNorm, ("forward",)))


def custom_norm_reason(norm: nn.Module, path: str) -> str | None:
    """Why a widening cannot pass through ``norm``, a subclass of a channel norm that computes
    its own forward (an activation inside, as in BiT's ``BitGroupNormActivation`` or timm's
    ``BatchNormAct2d``): the block-wise norm would replace that forward. None for torch's own
    norms (and their widened forms)."""
    cls = getattr(type(norm), "plain_class", type(norm))
    for base, calls in _OWN_CALLS:
        if isinstance(norm, base):
            if all(getattr(cls, name) is getattr(base, name) for name in calls):
                return None
            return (f"{path} ({cls.__name__}) is a {base.__name__.lstrip('_')} with a forward "
                    "of its own, which a widening cannot split by channel")
    return None


def norm_channels(norm: nn.Module) -> int:
    """The channels ``norm`` normalises."""
    return int(norm.num_channels if isinstance(norm, nn.GroupNorm) else norm.num_features)


def group_size(norm: nn.Module) -> int:
    """Channels per group: a widening through ``norm`` adds multiples of it (1 but for a
    GroupNorm)."""
    return norm.num_channels // norm.num_groups if isinstance(norm, nn.GroupNorm) else 1


def neuron_multiple(root: nn.Module, entry: LayerPlan) -> int:
    """The layer of ``entry`` gains neurons in multiples of this: the group sizes of the
    GroupNorms on the way, or grouped with it in one dendritic layer (1 where there is none).
    Raises PerforationError where such a norm computes a forward of its own."""
    norms = []
    for path, _ in entry.through:  # a module, or a function attribute (an activation)
        parent, _, attr = path.rpartition(".")
        try:
            owner = root.get_submodule(parent) if parent else root
        except AttributeError:  # not a module path: nothing to normalise there
            continue
        norms.append((path, getattr(owner, attr, None)))
    for path in (entry.path, *entry.partners):
        layer = root.get_submodule(path)
        if getattr(layer, "grouped", False):  # a conv and its norm wrapped as one layer
            norms.append((f"{path}.base.1", layer.base[1]))
    norms = [(path, n) for path, n in norms if isinstance(n, CHANNEL_NORMS)]
    for path, norm in norms:
        why = custom_norm_reason(norm, path)
        if why:
            raise PerforationError(f"widen(): {entry.path!r} cannot be widened: {why}")
    return math.lcm(1, *(group_size(n) for _, n in norms))


def widen_norm(norm: nn.Module, k: int, path: str) -> None:
    """k more channels, neutral, normalised apart from the old ones."""
    size = group_size(norm)
    if k % size:
        raise PerforationError(
            f"{path} (GroupNorm) normalises groups of {size} channels: a layer it follows "
            f"gains neurons in multiples of {size}, not {k}")
    blocks = list(getattr(norm, "out_blocks", None) or [norm_channels(norm)])
    neutral = {"weight": 1.0, "bias": 0.0, "running_mean": 0.0, "running_var": 1.0}
    _each_per_channel(norm, lambda name, old: torch.cat([old, old.new_full((k,),
                                                                        neutral[name])]))
    _resize(norm, norm_channels(norm) + k)
    make_blocked(norm)
    norm.out_blocks = [*blocks, k]


def shrink_norm(norm: nn.Module, k: int, path: str) -> None:
    """Give back the k channels of the widening being undone (the newest block)."""
    blocks = without_last_block(getattr(norm, "out_blocks", None), k, path)
    size = norm_channels(norm) - k
    _each_per_channel(norm, lambda name, old: old[:size].clone())
    _resize(norm, size)
    norm.out_blocks = blocks
    unblock_if_whole(norm)


def _each_per_channel(norm: nn.Module, change: Callable[[str, torch.Tensor], torch.Tensor]
                      ) -> None:
    """Replace each per-channel parameter and buffer the norm has with ``change(name, old)``
    (a parameter stays a parameter, with its ``requires_grad``)."""
    with torch.no_grad():
        for name in _PER_CHANNEL:
            old = getattr(norm, name, None)
            if old is None:
                continue
            data = change(name, old.detach())
            setattr(norm, name, nn.Parameter(data, requires_grad=old.requires_grad)
                    if isinstance(old, nn.Parameter) else data)


def _resize(norm: nn.Module, channels: int) -> None:
    """Set the norm's channel count (a GroupNorm's group count with it)."""
    if isinstance(norm, nn.GroupNorm):
        norm.num_groups = channels // group_size(norm)
        norm.num_channels = channels
    else:
        norm.num_features = channels


def norm_reason(norm: nn.Module, path: str, width: int, producer: str) -> str | None:
    """Why ``norm`` at ``path`` cannot pass on a widening of ``producer``, a layer of
    ``width`` outputs, or None."""
    have = norm_channels(norm)
    if have != width:
        return f"{path} normalises {have} channels, not the {width} {producer} gives"
    return custom_norm_reason(norm, path)
