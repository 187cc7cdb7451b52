"""Widened layers computed block by block, so widening changes no output bit.

A matrix product over a wider weight is not bit-identical to the narrow one on its old part
(the GEMM may block its sums differently when the inner or the outer size changes), and
neither are some elementwise functions (sigmoid, SiLU, tanh-GELU run their last elements
through a scalar path whose rounding differs from the vector path). So a layer that gained
neurons keeps the sizes it had at each widening as *blocks*: its weight is one tensor of the
new size (one parameter, one optimizer entry, plain state-dict keys), but its forward pass
computes each (output block, input block) piece on a contiguous copy of that piece, exactly
the call the narrow layer made, and adds the pieces (a zero piece adds an exact zero).

* :class:`BlockedLayer` (mixed into ``nn.Linear``, ``nn.Conv1d/2d/3d`` and Hugging Face's
  ``Conv1D`` by swapping the instance's class) holds ``out_blocks``/``in_blocks``
  (:class:`BlockedTransposedConv`, for a ``ConvTranspose`` reader, ``in_blocks`` only);
* :class:`BlockedBatchNorm`, :class:`BlockedInstanceNorm` and :class:`BlockedGroupNorm`
  normalise each channel block apart (statistics are per channel, or per group of channels,
  and a block holds whole groups, so the old channels' statistics and outputs are unchanged);
* :class:`Blockwise` wraps a stateless module or function (an activation, a pooling layer)
  and applies it to each block apart along one axis.

:func:`plain_modules` turns all three back into plain torch modules (export does that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PerforationError
from .chunked import forward_index, forward_order

BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
IN_TYPES = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
CHANNEL_NORMS = (*BN_TYPES, *IN_TYPES, nn.GroupNorm)
"""Norms a widening passes through: each gains channels (GroupNorm: whole groups)."""
CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
TRANSPOSED_CONVS = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
"""Transposed convs read a widened layer (they gain input channels: their weight is
[in, out, *kernel]); they do not gain neurons themselves."""


def is_hf_conv1d(module: nn.Module) -> bool:
    """True for Hugging Face's ``Conv1D`` (GPT-2): a Linear whose weight is [in, out]."""
    return any(c.__name__ == "Conv1D" for c in type(module).__mro__) and hasattr(module, "nf")


def spans(sizes: list[int]) -> list[tuple[int, int]]:
    """(start, length) of each block."""
    out, start = [], 0
    for size in sizes:
        out.append((start, size))
        start += size
    return out


Layout = torch.memory_format | list[int] | None


def dim_order(t: torch.Tensor) -> Layout:
    """``t``'s memory layout where it is not the contiguous one: channels_last (3d) where its
    strides are exactly those (also for a weight whose size-1 dims make it look contiguous,
    as a 1x1 or depthwise kernel does: the conv reads those strides), else its dims from
    outermost to innermost for another permuted dense layout (an unbatched input laid out
    channels-last), else None. A block keeps it: a conv or an elementwise kernel on another
    layout takes another code path and may round differently from the narrow layer's call."""
    if t.dim() in (4, 5):
        fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        if t.stride() == _strides(t, fmt) != _strides(t, torch.contiguous_format):
            return fmt
    if t.dim() < 2 or t.is_contiguous():
        return None
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    return order if t.permute(order).is_contiguous() else None


_INNER_FIRST = {torch.channels_last: (1, 3, 2, 0), torch.channels_last_3d: (1, 4, 3, 2, 0)}


def _strides(t: torch.Tensor, fmt: torch.memory_format) -> tuple[int, ...]:
    """The strides a fresh tensor of ``t``'s shape gets in ``fmt`` (as torch computes them:
    a size-1 dim counts as 1)."""
    inner_first = _INNER_FIRST.get(fmt, tuple(range(t.dim() - 1, -1, -1)))
    strides, step = [0] * t.dim(), 1
    for d in inner_first:
        strides[d] = step
        step *= max(int(t.shape[d]), 1)
    return tuple(strides)


def in_layout(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``t`` as a dense tensor in ``layout`` (see :func:`dim_order`; None: contiguous)."""
    if layout is None:
        return t.contiguous()
    if isinstance(layout, torch.memory_format):
        out = t.contiguous(memory_format=layout)
        return out if out.stride() == _strides(out, layout) else out.clone(memory_format=layout)
    inverse = sorted(range(len(layout)), key=layout.__getitem__)
    return t.permute(layout).contiguous().permute(inverse)


def same_layout(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` laid out in memory as ``like`` is (a widened or narrowed weight as its old one)."""
    return in_layout(t, dim_order(like))


def block_of(t: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    """``t.narrow(dim, start, length)`` as a dense copy in ``t``'s own layout."""
    return in_layout(t.narrow(dim, start, length), dim_order(t))


def joined(outs: list[torch.Tensor], dim: int, like: torch.Tensor) -> torch.Tensor:
    """The blocks put together along ``dim``, in ``like``'s layout (the narrow call's)."""
    out = torch.cat(outs, dim)
    order = dim_order(like)
    return out if order is None else in_layout(out, order)


def piece(t: torch.Tensor, dim: int, start: int, length: int, whole: bool) -> torch.Tensor:
    """One block of ``t`` along ``dim`` as a dense copy in its own layout (``t`` itself
    when whole)."""
    return t if whole else block_of(t, dim, start, length)


def blocked_apply(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  out_blocks: list[int], in_blocks: list[int], *, x_axis: int, out_axis: int,
                  w_out: int, w_in: int,
                  op: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None],
                               torch.Tensor]) -> torch.Tensor:
    """``op(x, weight, bias)`` computed per (output block, input block) piece and assembled:
    each piece is the call the layer made at the width of that block, on contiguous copies, so
    the old outputs keep their bits and a zero piece adds an exact zero."""
    outs = []
    one_in = len(in_blocks) == 1
    for o_start, o_len in spans(out_blocks):
        w_rows = piece(weight, w_out, o_start, o_len, len(out_blocks) == 1)
        acc = None
        for j, (i_start, i_len) in enumerate(spans(in_blocks)):
            w = piece(w_rows, w_in, i_start, i_len, one_in)
            xi = piece(x, x_axis, i_start, i_len, one_in)
            b = None if bias is None or j else piece(bias, 0, o_start, o_len,
                                                      len(out_blocks) == 1)
            t = op(xi, w, b)
            acc = t if acc is None else acc + t
        outs.append(acc)
    return outs[0] if len(outs) == 1 else joined(outs, out_axis, outs[0])


class BlockedLayer:
    """Mixin for a widened Linear, Conv or HF Conv1D: computes block by block."""

    out_blocks: list[int] | None = None
    in_blocks: list[int] | None = None

    def blocked(self) -> bool:
        return bool(self.out_blocks and len(self.out_blocks) > 1) or \
            bool(self.in_blocks and len(self.in_blocks) > 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.blocked():
            return super().forward(x)  # type: ignore[misc]
        if x.is_nested:
            if isinstance(self, nn.Linear) or is_hf_conv1d(self):  # type: ignore[arg-type]
                return per_rows(self, x)
            return per_component(self, x)
        y = self.blocked_call(x, self.weight, self.bias)  # type: ignore[attr-defined]
        return forward_order(self, y)  # a fused gate-and-up layer's halves (chunked.py)

    def blocks(self) -> tuple[list[int], list[int]]:
        """(output blocks, input blocks), each one block of the full size when not widened."""
        w = self.weight  # type: ignore[attr-defined]
        o_dim, i_dim = (1, 0) if is_hf_conv1d(self) else (0, 1)  # type: ignore[arg-type]
        return (list(self.out_blocks or [w.shape[o_dim]]),
                list(self.in_blocks or [w.shape[i_dim]]))

    def blocked_call(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     out_blocks: list[int] | None = None) -> torch.Tensor:
        """The layer's call with ``weight``/``bias`` (its own, or a dendrite's rows), block by
        block; ``out_blocks`` overrides the output blocks (a dendrite set's rows)."""
        outs, ins = self.blocks()
        outs = out_blocks or outs
        if is_hf_conv1d(self):  # type: ignore[arg-type]
            size_out = x.shape[:-1] + (weight.shape[1],)

            def mm(xi, w, b):
                return torch.mm(xi, w) if b is None else torch.addmm(b, xi, w)
            y = blocked_apply(x.reshape(-1, x.shape[-1]), weight, bias, outs, ins, x_axis=1,
                              out_axis=1, w_out=1, w_in=0, op=mm)
            return y.view(size_out)
        if isinstance(self, nn.Linear):
            return blocked_apply(x, weight, bias, outs, ins, x_axis=-1, out_axis=-1,
                                 w_out=0, w_in=1, op=F.linear)
        axis = 0 if x.dim() == weight.dim() - 1 else 1  # unbatched conv input
        if self.groups != 1:  # type: ignore[attr-defined]
            return depthwise_blocks(self, x, weight, bias, outs, axis)
        return blocked_apply(x, weight, bias, outs, ins, x_axis=axis, out_axis=axis,
                             w_out=0, w_in=1, op=self._conv_forward)  # type: ignore[attr-defined]


class BlockedTransposedConv(BlockedLayer):
    """Mixin for a ConvTranspose that gained input channels: one call per input block, summed
    (a zero block adds an exact zero), each the call the narrow layer made."""

    def blocks(self) -> tuple[list[int], list[int]]:
        w = self.weight  # type: ignore[attr-defined]
        return (list(self.out_blocks or [w.shape[1]]), list(self.in_blocks or [w.shape[0]]))

    def forward(self, x: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        conv: Any = self
        if not self.blocked():
            return super().forward(x, output_size)  # type: ignore[call-arg]
        dims = conv.weight.dim() - 2
        extra = conv._output_padding(x, output_size, conv.stride, conv.padding,
                                     conv.kernel_size, dims, conv.dilation)
        call = _TRANSPOSED_CALLS[dims]

        def op(xi: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
            return call(xi, w, b, conv.stride, conv.padding, extra, conv.groups, conv.dilation)
        axis = 0 if x.dim() == dims + 1 else 1  # an unbatched input
        outs, ins = self.blocks()
        return blocked_apply(x, conv.weight, conv.bias, outs, ins, x_axis=axis, out_axis=axis,
                             w_out=1, w_in=0, op=op)


_CONV_CALLS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_TRANSPOSED_CALLS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def depthwise_blocks(conv: nn.Module, x: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None, out_blocks: list[int],
                     axis: int) -> torch.Tensor:
    """A widened depthwise conv (one input channel per group, one output per channel)
    computed block by block: each block of channels is the call the narrow conv made, with
    as many groups as the block has channels, so the old channels keep their bits."""
    outs = []
    whole = len(out_blocks) == 1
    for start, length in spans(out_blocks):
        xi = piece(x, axis, start, length, whole)
        if conv.padding_mode != "zeros":  # type: ignore[attr-defined]
            xi = F.pad(xi, conv._reversed_padding_repeated_twice,  # type: ignore[attr-defined]
                       mode=conv.padding_mode)  # type: ignore[attr-defined]
            padding: Any = 0
        else:
            padding = conv.padding  # type: ignore[attr-defined]
        b = None if bias is None else piece(bias, 0, start, length, whole)
        outs.append(_CONV_CALLS[weight.dim() - 2](
            xi, piece(weight, 0, start, length, whole), b, conv.stride,  # type: ignore[attr-defined]
            padding, conv.dilation, length))  # type: ignore[attr-defined]
    return outs[0] if whole else joined(outs, axis, outs[0])


class BlockedNorm:
    """Base of the widened norms' mixins: ``out_blocks`` holds the channel blocks."""

    out_blocks: list[int] | None = None


def _cut(t: torch.Tensor | None, start: int, length: int) -> torch.Tensor | None:
    """One block of a per-channel parameter or buffer, as a view (running statistics are
    updated in place through it)."""
    return None if t is None else t.narrow(0, start, length)


class BlockedBatchNorm(BlockedNorm):
    """Mixin for a widened BatchNorm: each channel block is normalised apart (the same
    per-channel statistics, the same kernel call as before for the old channels)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = self.out_blocks
        if not blocks or len(blocks) == 1:
            return super().forward(x)  # type: ignore[misc]
        bn: Any = self
        bn._check_input_dim(x)
        factor = 0.0 if bn.momentum is None else bn.momentum
        if bn.training and bn.track_running_stats and bn.num_batches_tracked is not None:
            bn.num_batches_tracked.add_(1)
            factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None \
                else bn.momentum
        use_batch = bn.training or (bn.running_mean is None and bn.running_var is None)
        running = not bn.training or bn.track_running_stats
        axis = 1 if x.dim() > 1 else 0
        outs = [F.batch_norm(block_of(x, axis, start, length),
                             _cut(bn.running_mean, start, length) if running else None,
                             _cut(bn.running_var, start, length) if running else None,
                             _cut(bn.weight, start, length), _cut(bn.bias, start, length),
                             use_batch, factor, bn.eps)
                for start, length in spans(blocks)]
        return joined(outs, axis, x)


class BlockedInstanceNorm(BlockedNorm):
    """Mixin for a widened InstanceNorm: each channel block is normalised apart (statistics
    are per sample and channel; torch's own forward handles an unbatched input)."""

    def _apply_instance_norm(self, x: torch.Tensor) -> torch.Tensor:
        blocks = self.out_blocks
        if not blocks or len(blocks) == 1:
            return super()._apply_instance_norm(x)  # type: ignore[misc]
        norm: Any = self
        use_input = norm.training or not norm.track_running_stats
        momentum = norm.momentum if norm.momentum is not None else 0.0
        outs = [F.instance_norm(block_of(x, 1, start, length),
                                _cut(norm.running_mean, start, length),
                                _cut(norm.running_var, start, length),
                                _cut(norm.weight, start, length), _cut(norm.bias, start, length),
                                use_input, momentum, norm.eps)
                for start, length in spans(blocks)]
        return joined(outs, 1, x)


class BlockedGroupNorm(BlockedNorm):
    """Mixin for a widened GroupNorm: each channel block, whole groups of the same size, is
    normalised apart with the call the narrow norm made for it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = self.out_blocks
        if not blocks or len(blocks) == 1:
            return super().forward(x)  # type: ignore[misc]
        norm: Any = self
        size = norm.num_channels // norm.num_groups
        outs = [F.group_norm(block_of(x, 1, start, length), length // size,
                             _cut(norm.weight, start, length), _cut(norm.bias, start, length),
                             norm.eps)
                for start, length in spans(blocks)]
        return joined(outs, 1, x)


def per_component(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module`` applied to each tensor of a nested one (``nn.TransformerEncoder`` passes
    padded batches on as nested tensors in inference), nested again."""
    return torch.nested.nested_tensor([module(t) for t in x.unbind()])


def per_rows(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Linear ``module`` applied to the rows of all of a nested tensor's components in one
    call, nested again: torch's own nested linear is one product over those rows, and a
    product per component rounds differently on some CPUs (AVX-512 MKL)."""
    parts = x.unbind()
    rows = [p.reshape(-1, p.shape[-1]) for p in parts]
    out = module(torch.cat(rows)).split([r.shape[0] for r in rows])
    return torch.nested.nested_tensor([o.reshape(*p.shape[:-1], o.shape[-1])
                                       for o, p in zip(out, parts, strict=True)])


class Blockwise(nn.Module):
    """A stateless module or function applied to each block of ``axis`` apart."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], axis: int,
                 blocks: list[int]) -> None:
        super().__init__()
        self.fn = fn
        self.axis = int(axis)
        self.out_blocks = list(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_nested:
            return per_component(self, x)
        if x.shape[self.axis] != sum(self.out_blocks):
            return self.fn(x)  # another call of a shared activation (a ResNet block's relu)
        if x.is_contiguous() or dim_order(x) is not None:
            outs = [self.fn(block_of(x, self.axis, s, n)) for s, n in spans(self.out_blocks)]
        else:  # a strided view (a half of a fused layer's output): the narrow model's call
            # got one too, and erf's AVX-512 kernel rounds a view and a dense copy apart
            outs = [self.fn(x.narrow(self.axis, s, n)) for s, n in spans(self.out_blocks)]
        return joined(outs, self.axis, x)

    def extra_repr(self) -> str:
        return f"axis={self.axis}, blocks={self.out_blocks}"


_CLASSES: dict[type, type] = {}


def blocked_class(cls: type) -> type:
    """The blocked subclass of a Linear/Conv/ConvTranspose/HF Conv1D or channel norm class
    (made once, cached)."""
    if issubclass(cls, (BlockedLayer, BlockedNorm)):
        return cls
    if cls not in _CLASSES:
        mixin = next((m for types, m in ((BN_TYPES, BlockedBatchNorm),
                                         (IN_TYPES, BlockedInstanceNorm),
                                         ((nn.GroupNorm,), BlockedGroupNorm),
                                         (TRANSPOSED_CONVS, BlockedTransposedConv))
                      if issubclass(cls, types)), BlockedLayer)
        made = type(f"Blocked{cls.__name__}", (mixin, cls), {"__module__": __name__,
                                                             "plain_class": cls})
        made.__qualname__ = made.__name__
        globals()[made.__name__] = made  # so the class can be found by name (pickle)
        _CLASSES[cls] = made
    return _CLASSES[cls]


for _cls in (nn.Linear, *CONV_TYPES, *TRANSPOSED_CONVS, *CHANNEL_NORMS):
    blocked_class(_cls)


def make_blocked(module: nn.Module) -> None:
    """Swap ``module``'s class for its blocked subclass (same parameters, same state keys)."""
    if isinstance(module, (nn.Linear, *CONV_TYPES, *TRANSPOSED_CONVS, *CHANNEL_NORMS)) \
            or is_hf_conv1d(module):
        module.__class__ = blocked_class(type(module))
        return
    raise PerforationError(f"cannot compute a {type(module).__name__} block by block")


def plain_modules(model: nn.Module) -> nn.Module:
    """Turn every blocked layer of ``model`` back into its plain class, in place, and every
    :class:`Blockwise` into the module or function it wraps (the outputs then agree within
    float rounding, no longer to the bit). Returns ``model`` (or the unwrapped root)."""
    for module in list(model.modules()):
        if isinstance(module, BlockedLayer | BlockedNorm):
            _rows_in_forward_order(module)
            module.__class__ = type(module).plain_class
            for attr in ("out_blocks", "in_blocks", "out_chunks"):
                module.__dict__.pop(attr, None)
    for name, module in sorted(model.named_modules(), key=lambda kv: -len(kv[0])):
        if isinstance(module, Blockwise):
            if not name:
                return module.fn if isinstance(module.fn, nn.Module) else nn.Identity()
            parent_path, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            if isinstance(module.fn, nn.Module):
                parent._modules[attr] = module.fn  # in place: a Sequential keeps its order
            else:
                del parent._modules[attr]
                setattr(parent, attr, module.fn)
    return model


def _rows_in_forward_order(module: nn.Module) -> None:
    """A widened fused gate-and-up layer's rows put in the order its output is read, so the
    plain layer computes what the blocked one did (:mod:`perfora.nn.chunked`)."""
    index = forward_index(module)
    if index is None:
        return
    dim = 1 if is_hf_conv1d(module) else 0
    with torch.no_grad():
        module.weight.copy_(module.weight.index_select(dim, index.to(module.weight.device)))
        if module.bias is not None:
            module.bias.copy_(module.bias.index_select(0, index.to(module.bias.device)))


def without_last_block(blocks: list[int] | None, k: int, where: str) -> list[int]:
    """``blocks`` less its newest, which must be the ``k`` units a narrowing gives back."""
    if not blocks or len(blocks) < 2 or blocks[-1] != k:
        raise PerforationError(f"{where}: its newest block is not the {k} units of the "
                               f"widening being undone (blocks {blocks}); it was changed "
                               "after the widening")
    return list(blocks[:-1])


def unblock_if_whole(module: nn.Module) -> None:
    """A layer left with one block on each side becomes its plain class again."""
    if not isinstance(module, BlockedLayer | BlockedNorm):
        return
    if any(len(getattr(module, side, None) or []) > 1 for side in ("out_blocks", "in_blocks")):
        return
    module.__class__ = type(module).plain_class
    for side in ("out_blocks", "in_blocks"):
        module.__dict__.pop(side, None)
