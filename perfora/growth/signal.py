"""The error signal: samples of each dendritic layer's input and output gradient.

Growth that spends parameters where they pay needs to know, per neuron, what error is left:
``E = dL/dy``, the gradient of the loss w.r.t. the layer's output, next to the input ``x``
that produced it. :class:`ErrorSignalProbe` records such (input row, error row) pairs while it
is armed (the controller arms it only in the epoch before a growth step may come, so other
epochs pay nothing). Linear layers give one row per sample (and per position for 3-D inputs);
ungrouped Conv1d/Conv2d layers give one row per output position, the input row being the
receptive-field patch (``unfold``), so a row times a dendrite's flattened weight is that
dendrite's pre-activation there. The newest ``max_rows`` rows per layer are kept (fewer for
very wide rows: at most 16 MB per layer), on the CPU. Passes under a ``torch.func`` transform
and batched gradients are not recorded (their tensors belong to the transform); a layer left
without rows grows a full set with the 'default' initialisation.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.chunked import stored_order
from ..nn.kernels import functorch_active, vmapped
from ..nn.layers import DendriticLayer
from .compile_room import HookRecompiles
from .transient_hooks import TransientHook


def input_rows(layer: DendriticLayer, x: torch.Tensor) -> torch.Tensor | None:
    """The layer input as rows a dendrite weight (flattened) multiplies; None if unsupported."""
    src = layer.source
    if layer.kind == "linear":
        return x.detach().reshape(-1, x.shape[-1])
    if layer.kind != "conv" or not layer.supports_partial_sets() or isinstance(src, nn.Conv3d) \
            or src.padding_mode != "zeros" or isinstance(src.padding, str):
        return None
    if isinstance(src, nn.Conv1d):
        x = x.unsqueeze(2)
        kernel, dil, pad, stride = ((1, src.kernel_size[0]), (1, src.dilation[0]),
                                    (0, src.padding[0]), (1, src.stride[0]))
    else:
        kernel, dil, pad, stride = src.kernel_size, src.dilation, src.padding, src.stride
    if x.dim() != 4:  # unbatched conv input
        return None
    patches = F.unfold(x.detach(), kernel, dilation=dil, padding=pad, stride=stride)
    return patches.transpose(1, 2).reshape(-1, patches.shape[1])


def error_rows(layer: DendriticLayer, grad: torch.Tensor) -> torch.Tensor:
    """The output gradient as rows of one value per neuron, in the order of input_rows."""
    axis = layer.neuron_axis % grad.dim()
    grad = stored_order(layer.source, grad.detach(), axis)  # a fused gate-and-up layer
    return grad.movedim(axis, -1).reshape(-1, layer.num_neurons)


MAX_VALUES_PER_LAYER = 4_000_000
"""Values (16 MB of float32) one layer's rows may hold: wide conv patches keep fewer rows."""


class ErrorSignalProbe:
    """Keeps the newest (input row, error row) pairs of every dendritic layer while armed."""

    def __init__(self, max_rows: int = 2048) -> None:
        self.max_rows = int(max_rows)
        self._handles: list = []
        self._rows: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self._recompiles = HookRecompiles()  # a compiled model runs the hooks too

    @property
    def armed(self) -> bool:
        """True while hooks record the layers' forward/backward passes."""
        return bool(self._handles)

    def arm(self, layers: Mapping[str, DendriticLayer]) -> None:
        """Start recording every layer's training passes (no-op when already armed)."""
        if self.armed:
            return
        for path, layer in layers.items():
            self._handles.append(layer.register_forward_hook(TransientHook(self._hook(path))))
        if self._handles:
            self._recompiles.armed(layers.values())

    def disarm(self) -> None:
        """Stop recording; the rows kept so far stay available."""
        if self._handles:
            self._recompiles.disarmed()
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def clear(self) -> None:
        """Drop every row kept (after a growth step used them)."""
        self._rows = {}

    def _hook(self, path: str):
        def record(layer: DendriticLayer, args: tuple, output: torch.Tensor) -> None:
            if not (layer.training and torch.is_grad_enabled() and args
                    and isinstance(output, torch.Tensor) and output.requires_grad) \
                    or functorch_active():  # rows wrapped by a transform must not escape it
                return
            rows = input_rows(layer, args[0])
            if rows is None:
                return
            limit = self._limit(rows.shape[1] + layer.num_neurons)
            keep = max(1, limit // 8)
            step = max(1, rows.shape[0] // keep)  # at most 1/8 of the buffer per batch

            def on_grad(grad: torch.Tensor) -> None:
                if vmapped(grad):  # batched gradients: not one backward pass of errors
                    return
                errors = error_rows(layer, grad)
                if errors.shape[0] == rows.shape[0]:
                    self._append(path, rows[::step].float(), errors[::step].float(), limit)

            output.register_hook(on_grad)
        return record

    def _limit(self, width: int) -> int:
        """Rows kept for a layer whose (input, error) row holds ``width`` values."""
        return max(16, min(self.max_rows, MAX_VALUES_PER_LAYER // max(1, width)))

    def _append(self, path: str, x: torch.Tensor, e: torch.Tensor, limit: int) -> None:
        xs, es = self._rows.setdefault(path, ([], []))
        xs.append(x.cpu())
        es.append(e.cpu())
        total = sum(t.shape[0] for t in xs)
        while len(xs) > 1 and total - xs[0].shape[0] >= limit:
            total -= xs.pop(0).shape[0]
            es.pop(0)

    def samples(self, path: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(inputs, errors) rows kept for one layer, newest ``max_rows``; None if none."""
        if path not in self._rows or not self._rows[path][0]:
            return None
        xs, es = self._rows[path]
        limit = self._limit(xs[0].shape[1] + es[0].shape[1])
        return torch.cat(xs)[-limit:], torch.cat(es)[-limit:]

    def row_count(self, path: str) -> int:
        """Rows kept for one layer."""
        found = self.samples(path)
        return 0 if found is None else int(found[0].shape[0])
