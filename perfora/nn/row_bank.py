"""The bank Linear and Conv layers share: K dendrites as the rows of one taller weight.

Dendrite k's rows sit one after another in ``bank_weight``/``bank_bias`` (per conv group:
``[groups, K, rows_per_group, ...]``), and each dendrite is evaluated by its own call on its
slice, so D_k(x) has the same bits whatever K is (exact growth). A set may feed only some
neurons (selective growth): it then has rows for those neurons only, its d is added into the
output at their indices, and the cascade reads earlier sets through index maps. With K >= 2
full sets the mix runs as one fused node (:mod:`perfora.nn.kernels`) when the kind's geometry
allows it (:meth:`RowBankLayer._fused_layout`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import PerforationError
from .blocks import BlockedLayer
from .candidate import CANDIDATE_NAMES
from .kernels import FusedMix, MixSpec
from .layers import _ACTIVATIONS, DendriticLayer, _transformed, index_add_promoted


class RowBankLayer(DendriticLayer):
    """A dendritic layer whose dendrites are rows of one Linear/Conv weight."""

    def supports_partial_sets(self) -> bool:
        """True when a dendrite set may feed only some neurons (Linear, ungrouped Conv)."""
        return self._groups() == 1

    def _set_mask(self, neurons: list[list[int] | None] | None, k: int) -> None:
        """Record which neurons each of the k sets feeds, checked: a mask row per set."""
        if neurons is None or all(n is None for n in neurons) or not self.supports_partial_sets():
            super()._set_mask(neurons, k)
            return
        self._index_cache = None
        if len(neurons) != k:
            raise PerforationError(f"got neuron lists for {len(neurons)} dendrite sets, "
                                   f"expected {k}")
        ref = self._reference()
        mask = torch.zeros(k, self.num_neurons, dtype=torch.bool, device=ref.device)
        for row, chosen in enumerate(neurons):
            if chosen is None:
                mask[row] = True
                continue
            index = torch.as_tensor(list(chosen), dtype=torch.long)
            if index.numel() == 0 or index.min() < 0 or index.max() >= self.num_neurons \
                    or index.unique().numel() != index.numel():
                raise PerforationError(f"dendrite set {row}: neuron indices must be distinct, "
                                       f"in [0, {self.num_neurons}) and not empty, got "
                                       f"{list(chosen)[:8]}")
            mask[row, index.to(ref.device)] = True
        self.dendrite_mask = mask
        self._keep_lists([list(range(self.num_neurons)) if chosen is None else sorted(chosen)
                          for chosen in neurons])

    def _set_sizes(self) -> list[int]:
        """Bank rows per dendrite set (neurons fed, times nothing else: groups are 1)."""
        if self.dendrite_mask is None:
            return [self.num_neurons] * self.num_dendrites
        return [len(row) for row in self._set_lists]

    # ------------------------------------------------------------------ the bank
    def _bank_key(self, name: str) -> str | None:
        return name if name in ("weight", "bias") else None

    def _new_bank(self, k: int, kw: dict[str, Any]) -> None:
        src = self.source
        rows = sum(self._set_sizes())
        self.bank_weight = self._new_param(
            torch.zeros(rows, *src.weight.shape[1:], **kw), "bank")
        self.bank_bias = (None if src.bias is None else
                          self._new_param(torch.zeros(rows, **kw), "bank"))

    def _append_bank(self, new: dict[str, torch.Tensor], k: int) -> None:
        self.bank_weight = self._new_param(
            self._append_rows(self.bank_weight, new["weight"], k), "bank")
        if "bias" in new:
            self.bank_bias = self._new_param(
                self._append_rows(self.bank_bias, new["bias"], k), "bank")

    def _append_rows(self, bank: torch.Tensor | None, rows: torch.Tensor,
                     k: int) -> torch.Tensor:
        """Append one dendrite's rows to a bank of k, keeping conv groups contiguous."""
        if bank is None:
            return rows.detach().clone()
        g = self._groups()
        if g == 1:
            return torch.cat([bank.detach(), rows.detach()])
        per = rows.shape[0] // g
        old = bank.detach().reshape(g, k, per, *rows.shape[1:])
        new = rows.reshape(g, 1, per, *rows.shape[1:])
        return torch.cat([old, new], dim=1).reshape(g * (k + 1) * per, *rows.shape[1:])

    def _bank_parameters(self) -> list[nn.Parameter]:
        return [p for p in (self.bank_weight, self.bank_bias) if p is not None]

    # ------------------------------------------------------------------ candidate
    def _split_bank(self, k: int) -> None:
        for bank, cand in (("bank_weight", "candidate_weight"), ("bank_bias", "candidate_bias")):
            t = getattr(self, bank)
            if t is None:
                continue
            rows = t.detach().reshape(self._groups(), k, -1, *t.shape[1:])
            setattr(self, bank, None if k == 1 else self._new_param(
                rows[:, :k - 1].reshape(-1, *t.shape[1:]).clone(), "bank"))
            setattr(self, cand, self._new_param(
                rows[:, k - 1].reshape(-1, *t.shape[1:]).clone(), "candidate"))

    def _merged_bank(self, k: int) -> dict[str, torch.Tensor]:
        out = {"bank_weight": self._append_rows(self.bank_weight,
                                                self.candidate_weight.detach(), k)}
        if self.candidate_bias is not None:
            out["bank_bias"] = self._append_rows(self.bank_bias, self.candidate_bias.detach(), k)
        return out

    def _take_merged_bank(self, merged: dict[str, torch.Tensor]) -> None:
        self.bank_weight = self._new_param(merged["bank_weight"], "bank")
        if "bank_bias" in merged:
            self.bank_bias = self._new_param(merged["bank_bias"], "bank")

    def _candidate_parameters(self) -> list[nn.Parameter]:
        return [p for p in (getattr(self, n) for n in CANDIDATE_NAMES) if p is not None]

    def _candidate_pre(self, x: torch.Tensor) -> torch.Tensor:
        return self._dendrite_call(x, self.candidate_weight, self.candidate_bias)

    # ------------------------------------------------------------------ forward
    def _dendrite_call(self, x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
        """One dendrite's D(x) from its rows: the wrapped layer's call with other weights."""
        raise NotImplementedError

    def _dendrite_weights(self) -> tuple[list, list]:
        """Each dendrite's (weight, bias): views of the bank, copies only for grouped convs."""
        k, g = self.banked, self._groups()
        bias = self.bank_bias
        if k == 1:
            return [self.bank_weight], [bias]
        if g == 1:
            sizes = self._set_sizes()[:k]
            return (list(self.bank_weight.split(sizes)),
                    [None] * k if bias is None else list(bias.split(sizes)))
        per = self.num_neurons // g
        w = [t.flatten(0, 1) for t in self.bank_weight.unflatten(0, (g, k, per)).unbind(1)]
        b = ([None] * k if bias is None else
             [t.flatten(0, 1) for t in bias.unflatten(0, (g, k, per)).unbind(1)])
        return w, b

    def _bank_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """D_k(x) for every k, each by its own call on its slice of the one bank tensor: D_k(x)
        then has the same shapes, hence the same bits, whatever K is (exact growth), and no
        buffer K times a feature map is allocated."""
        w, b = self._dendrite_weights()
        src = self.source
        if isinstance(src, BlockedLayer) and src.blocked():
            # a widened layer: each dendrite computed block by block like its base (a full
            # set has the base's output blocks; a set of chosen neurons, one block)
            full = src.blocks()[0]
            return [src.blocked_call(x, w[i], b[i], full if w[i].shape[0] == self.num_neurons
                                     else [w[i].shape[0]]) for i in range(self.banked)]
        return [self._dendrite_call(x, w[i], b[i]) for i in range(self.banked)]

    def _mix(self, x: torch.Tensor, y: torch.Tensor,
             shape: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The fused node where it applies, the mix of partial sets, else the autograd mix
        (the d_k only where a candidate needs them: the fused path returns none)."""
        spec = self._fused_spec(x, y)
        if spec is not None:
            return FusedMix.apply(y, x, self.bank_weight, self.bank_bias, self.cascade,
                                  self.out_weight, spec, self._fused_conv_forward()), []
        if self.dendrite_mask is not None:
            return self._mix_partial(self._bank_outputs(x), y, shape), []
        return super()._mix(x, y, shape)

    def _fused_spec(self, x: torch.Tensor, y: torch.Tensor) -> MixSpec | None:
        """The fused mix's static arguments when it applies here, else None (see kernels.py):
        eager mode, K >= 2 full sets, no candidate apart, ungrouped, the kind's geometry
        (:meth:`_fused_layout`), one dtype throughout, no autocast, no ``torch.func``
        transform and no forward-mode AD (the node has neither a vmap rule nor a jvp: the
        autograd code has)."""
        if self.num_dendrites < 2 or self.has_candidate or self.dendrite_mask is not None \
                or self._groups() != 1 or _tracing() or _transformed() \
                or isinstance(self.source, BlockedLayer) and self.source.blocked():
            return None  # K = 1: autograd's three nodes cost less than one Python node
        spec = self._fused_layout(x, y)
        dtype = x.dtype
        if spec is None or y.dtype != dtype or self.bank_weight.dtype != dtype \
                or self.out_weight.dtype != dtype or _autocasting(x.device.type):
            return None
        return spec

    def _fused_layout(self, x: torch.Tensor, y: torch.Tensor) -> MixSpec | None:
        """The fused node's spec when this input and output suit the kind's kernel."""
        raise NotImplementedError

    def _fused_conv_forward(self) -> Callable | None:
        """The conv call the fused node runs per dendrite (None: a Linear needs none)."""
        return None

    def _partial_indices(self, device: torch.device) -> tuple[list, dict]:
        """Per set the fed neurons' indices, and per cascade pair (i, j) where set i's neurons
        sit in set j's padded outputs (the pad, index m_j, holds zeros). Cached."""
        key = device
        if self._index_cache is None or self._index_cache[0] != key:
            index = [torch.tensor(row, dtype=torch.long) for row in self._set_lists]
            where = {}
            for i in range(len(index)):
                for j in range(i):
                    pos = torch.full((self.num_neurons,), len(index[j]), dtype=torch.long)
                    pos[index[j]] = torch.arange(len(index[j]))
                    where[i, j] = pos[index[i]].to(device)
            self._index_cache = (key, [t.to(device) for t in index], where)
        return self._index_cache[1], self._index_cache[2]

    def _mix_partial(self, pre: list[torch.Tensor], y: torch.Tensor,
                     shape: list[int]) -> torch.Tensor:
        """The mix when sets feed only some neurons: each set's d lives on its own neurons and
        is added into the output at their indices (index_add), exact for a zero ``v`` row."""
        act = _ACTIVATIONS[self.activation]
        axis = self.neuron_axis % y.ndim
        index, where = self._partial_indices(y.device)
        v = self.out_weight.view(-1, *shape).unbind(0)
        w = self.cascade.view(-1, *shape).unbind(0) if self.cascade is not None else []
        padded: list[torch.Tensor] = []
        out, row = y, 0
        for i, a in enumerate(pre):
            for j in range(i):
                a = a + w[row].index_select(axis, index[i]) * \
                    padded[j].index_select(axis, where[i, j])
                row += 1
            d = act(a)
            pad_shape = list(d.shape)
            pad_shape[axis] = 1
            padded.append(torch.cat([d, d.new_zeros(pad_shape)], axis))
            out = index_add_promoted(out, axis, index[i], v[i].index_select(axis, index[i]) * d)
        return out


def _tracing() -> bool:
    """True under torch.compile / torch.export / TorchScript tracing: the plain code then."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.jit.is_scripting()


def _autocasting(device_type: str) -> bool:
    """Autocast on for this device type; False for a type autocast does not know (meta)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # older torch: no device argument
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()
    except RuntimeError:  # "unknown device type for autocast": it cannot be on
        return False
