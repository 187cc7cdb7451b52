"""The error signal neuron growth reads: per widenable layer, ``M = E[g_C^T x_P]``.

GradMax picks the incoming weights of new neurons from the cross-covariance between the
producer's input ``x_P`` and the loss gradient at its consumer's output ``g_C`` (see
:func:`perfora.nn.widening.gradmax_rows`). :class:`WideningSignal` sums that matrix over the
training passes of an armed epoch (the controller arms it only in the epoch before a growth
step may come): a forward hook keeps the producer's input of the pass, and a gradient hook on
the consumer's output adds ``g^T x`` for it. A Linear (or HF Conv1D) producer read by one
Linear (or Conv1D) consumer through elementwise modules (no depthwise conv) has rows that pair
up one to one; a conv read by one conv, or by a Linear after a flatten, has the matrix of
:mod:`perfora.growth.conv_signal`; other layers grow with random incoming weights. Sums are
reduced over ranks before use, so every rank draws the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..distributed.collectives import all_reduce_values
from ..nn.blocks import is_hf_conv1d
from ..nn.consumers import LayerPlan
from ..nn.kernels import functorch_active, vmapped
from ..nn.plan_types import is_grouped_conv
from .compile_room import HookRecompiles
from .conv_signal import ConvPair, conv_pair, core_layer
from .transient_hooks import TransientHook


def _dense(module: nn.Module) -> bool:
    core = core_layer(module)
    return isinstance(core, nn.Linear) or is_hf_conv1d(core)


def pairs_rows(root: nn.Module, entry: LayerPlan) -> bool:
    """True when the producer's input rows and its one consumer's output rows pair up."""
    if not entry.widenable or entry.partners or entry.chunks > 1 \
            or len(entry.consumers) != 1:
        return False
    consumer, repeat = entry.consumers[0]
    return repeat == 1 and _dense(root.get_submodule(entry.path)) \
        and _dense(root.get_submodule(consumer)) \
        and not any(_mixes_positions(root, path) for path, _axis in entry.through)


def _mixes_positions(root: nn.Module, path: str) -> bool:
    """A depthwise conv on the way (SegFormer's Mix-FFN): a new unit's value then depends on
    neighbouring rows, which the one-to-one pairing leaves out, so such a layer grows with
    random rows, as a conv pair through a depthwise conv does."""
    try:
        return is_grouped_conv(root.get_submodule(path))
    except AttributeError:
        return False  # a function found by torch.fx


def signal_shape(root: nn.Module, entry: LayerPlan) -> tuple[int, int]:
    """(rows, columns) of the recorded matrix of a layer with a signal: (the consumer's
    outputs, the producer's inputs) for a Linear pair, ``ConvPair.shape`` for a conv."""
    pair = conv_pair(root, entry)
    if pair is not None:
        return pair.shape()
    return (_width(root.get_submodule(entry.consumers[0][0]), "out"),
            _width(root.get_submodule(entry.path), "in"))


def _width(module: nn.Module, side: str) -> int:
    """A layer's output ('out') or input ('in') width (HF Conv1D's weight is [in, out])."""
    core = core_layer(module)
    dims = (1, 0) if is_hf_conv1d(core) else (0, 1)
    return int(core.weight.shape[dims[0] if side == "out" else dims[1]])


class WideningSignal:
    """Sums ``g_C^T x_P`` per widenable layer while armed (hooks removed when disarmed);
    ``convs``: convolutions' matrices too."""

    def __init__(self, convs: bool = True) -> None:
        self.convs = convs  # record convolutions too (PerforaConfig.conv_gradmax)
        self._handles: list[Any] = []
        self._inputs: dict[str, torch.Tensor] = {}
        self._sums: dict[str, torch.Tensor] = {}
        self._rows: dict[str, int] = {}
        self._convs: dict[str, ConvPair] = {}
        self.paths: list[str] = []
        self._recompiles = HookRecompiles()  # a compiled model runs the hooks too

    @property
    def armed(self) -> bool:
        """True while the hooks record training passes."""
        return bool(self._handles)

    def arm(self, root: nn.Module, plan: Mapping[str, LayerPlan]) -> None:
        """Record, for every layer of ``plan`` whose rows pair up, the training passes."""
        if self.armed:
            return
        self._convs = {p: pair for p, entry in plan.items()
                       if self.convs and (pair := conv_pair(root, entry)) is not None}
        self.paths = sorted(p for p, entry in plan.items()
                            if p in self._convs or pairs_rows(root, entry))
        hooked: list[nn.Module] = []
        for path in self.paths:
            producer = root.get_submodule(path)
            consumer = root.get_submodule(plan[path].consumers[0][0])
            self._handles.append(producer.register_forward_hook(
                TransientHook(self._keep_input(path))))
            self._handles.append(consumer.register_forward_hook(
                TransientHook(self._add_product(path))))
            hooked += [producer, consumer]
        if hooked:
            self._recompiles.armed(hooked)

    def disarm(self) -> None:
        """Stop recording; the sums so far stay available."""
        if self._handles:
            self._recompiles.disarmed()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._inputs = {}

    def clear(self) -> None:
        """Drop the sums (after a growth step used them)."""
        self._sums, self._rows = {}, {}

    def _keep_input(self, path: str):
        def keep(module: nn.Module, args: tuple, output: Any) -> None:
            if module.training and torch.is_grad_enabled() and args \
                    and isinstance(args[0], torch.Tensor) and not functorch_active():
                x = args[0].detach()
                self._inputs[path] = x if path in self._convs else x.reshape(-1, x.shape[-1])
        return keep

    def _add_product(self, path: str):
        def add(module: nn.Module, args: tuple, output: Any) -> None:
            x = self._inputs.pop(path, None)
            if x is None or not isinstance(output, torch.Tensor) or not output.requires_grad:
                return

            def on_grad(grad: torch.Tensor) -> None:
                if vmapped(grad):
                    return
                pair = self._convs.get(path)
                if pair is not None:
                    with torch.no_grad():
                        found = pair.matrix(x, grad.detach())
                    if found is None:
                        return
                    product, rows = found
                else:
                    g = grad.detach().reshape(-1, grad.shape[-1])
                    if g.shape[0] != x.shape[0]:
                        return
                    product, rows = g.float().T @ x.float(), int(g.shape[0])  # [out, in]
                total = self._sums.get(path)
                self._sums[path] = product if total is None else total + product
                self._rows[path] = self._rows.get(path, 0) + rows

            output.register_hook(on_grad)
        return add

    def reduced(self, shapes: Mapping[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
        """Per layer path (every one of ``shapes``, (out, in), in sorted order on every rank):
        ``E[g x^T]`` over every rank's recorded rows, float64 on the CPU; layers no rank
        recorded are left out. A collective under torch.distributed."""
        paths = sorted(shapes)
        if not paths:
            return {}
        parts, counts = [], []
        for path in paths:
            out, inp = shapes[path]
            total = self._sums.get(path)
            ok = total is not None and tuple(total.shape) == (out, inp)
            parts.append(total.double().cpu().reshape(-1) if ok
                         else torch.zeros(out * inp, dtype=torch.float64))
            counts.append(float(self._rows.get(path, 0)) if ok else 0.0)
        flat = all_reduce_values(torch.cat([torch.tensor(counts, dtype=torch.float64),
                                            *parts]))
        counts_all, sums = flat[:len(paths)], flat[len(paths):]
        result, offset = {}, 0
        for path, count in zip(paths, counts_all.tolist(), strict=True):
            out, inp = shapes[path]
            block = sums[offset:offset + out * inp].reshape(out, inp)
            offset += out * inp
            if count > 0:
                result[path] = block / count
        return result
