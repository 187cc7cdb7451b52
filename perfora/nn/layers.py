"""DendriticLayer: a wrapped layer plus one batched bank of K dendrites, grown exactly.

With K dendrites on neuron layer N (``D_k`` a layer shaped like N, ``w`` the cascade between
dendrites, ``v`` their output weights, one value per neuron each)::

    a_k = D_k(x) + sum_{j<k} w[k, j] * d_j      d_k = act(a_k)      y = N(x) + sum_k v[k] * d_k

All K dendrite layers of a wrapped layer live in one tensor (a K-times wider Linear/Conv
weight, or stacked parameters evaluated with one ``torch.func.vmap`` call for other
modules): one parameter, one optimizer entry, one gradient bucket. Linear/Conv dendrites are
evaluated slice by slice of that tensor: measured, this is as fast as one wide kernel (faster
at large batch: no K-sized zero-filled gradient buffers) and keeps growth bit-exact, which a
wider GEMM does not (it may round the old columns differently).
A new dendrite starts with zero ``v`` and ``w`` rows, so growth leaves the output unchanged.
In eager training with K >= 2 full sets on a Linear or ungrouped Conv, the mix after the
bank GEMMs runs as one autograd node with a hand-written backward (:mod:`perfora.nn.kernels`):
the same forward kernels in the same order, and one GEMM (or one ``convolution_backward``)
for the whole bank's gradients; the code below is used everywhere else, and when tracing.

A dendrite *set* may feed only some neurons (selective growth): its bank rows then exist only
for those neurons, and a ``dendrite_mask`` buffer (sets x neurons) records which neurons each
set feeds. The buffer is saved in the state dict, so a state alone rebuilds the structure.

A learning rule may train the newest dendrite apart (the correlation rule's *candidate*):
:meth:`DendriticLayer.split_candidate` moves it out of the bank into parameters of its own,
so it can train while the bank stays frozen, and :meth:`DendriticLayer.merge_candidate`
puts it back, bit for bit. The candidate gets ``x.detach()`` and the detached outputs of the
older dendrites, is not added to the output (its ``v`` row is zero), and is handed with the
output to the rule's ``candidate_tap``, which gives it a gradient of its own. The state dict
always holds the merged form, so checkpoints do not depend on the split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PerforationError
from .kernels import FusedMix, MixSpec, functorch_active

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "relu": F.relu,
}
_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
PARAM_GROUPS = ("base", "bank", "cascade", "out", "candidate")
_CANDIDATE_NAMES = ("candidate_weight", "candidate_bias", "candidate_cascade")


def index_add_promoted(out: torch.Tensor, axis: int, index: torch.Tensor,
                       term: torch.Tensor) -> torch.Tensor:
    """``out.index_add(axis, index, term)`` in the promoted dtype, as ``out + term`` would be
    (under autocast a bf16 output meets float32 ``v`` rows; index_add refuses mixed dtypes)."""
    dtype = torch.promote_types(out.dtype, term.dtype)
    return out.to(dtype).index_add(axis, index, term.to(dtype))


def bank_kind(module: nn.Module) -> str:
    """'linear', 'conv' or 'generic': how a module's dendrites are batched."""
    if type(module) is nn.Linear or isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, _CONV_TYPES):
        return "conv"
    return "generic"


class DendriticLayer(nn.Module):
    """A module plus a growable bank of dendrites that feed its neurons.

    ``base`` is the original module (or a ``Sequential(layer, norm)`` group whose first
    element is the layer the dendrites copy). ``neuron_axis`` is the axis of the output
    that indexes neurons: -1 for Linear, 1 for Conv, anything for other modules.
    """

    def __init__(
        self,
        base: nn.Module,
        *,
        num_neurons: int,
        neuron_axis: int,
        activation: str = "sigmoid",
        grouped: bool = False,
    ) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise PerforationError(f"unknown activation {activation!r}; use one of "
                                   f"{sorted(_ACTIVATIONS)}")
        if num_neurons < 1:
            raise PerforationError(f"a dendritic layer needs at least one neuron, got "
                                   f"{num_neurons}")
        self.base = base
        self.grouped = grouped
        self.num_neurons = int(num_neurons)
        self.neuron_axis = int(neuron_axis)
        self.activation = activation
        self.kind = bank_kind(self.source)
        self.num_dendrites = 0
        self._trainable = dict.fromkeys(PARAM_GROUPS, True)
        # base parameters the user froze: no rule phase, growth or load unfreezes them
        self.frozen_base_names: set[str] = {n for n, p in base.named_parameters()
                                            if not p.requires_grad}
        # Parameters exist only when K > 0, so no tensor is ever left without a gradient.
        for name in ("bank_weight", "bank_bias", "cascade", "out_weight", *_CANDIDATE_NAMES):
            self.register_parameter(name, None)
        self.bank_params = nn.ParameterDict()
        self.candidate_params = nn.ParameterDict()
        self.has_candidate = False
        # set by a learning rule: (output, candidate output) -> output, identity in forward
        self.candidate_tap: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        self.register_buffer("dendrite_mask", None)  # (sets, neurons) bool; None: every set full
        self._index_cache: tuple | None = None
        self._set_lists: list[list[int]] | None = None  # the mask's rows as index lists
        self.register_state_dict_post_hook(_merged_state_hook)

    # ------------------------------------------------------------------ structure
    @property
    def source(self) -> nn.Module:
        """The layer whose shape every dendrite copies."""
        return self.base[0] if self.grouped else self.base  # type: ignore[index]

    def _reference(self) -> torch.Tensor:
        for p in self.source.parameters():
            return p
        for p in self.base.parameters():
            return p
        raise PerforationError("cannot perforate a module without parameters")

    @property
    def weight(self) -> torch.Tensor | None:
        """The wrapped layer's weight, for code that reads it (dtype, device, shape)."""
        return getattr(self.source, "weight", None)

    @property
    def bias(self) -> torch.Tensor | None:
        """The wrapped layer's bias (None when it has none)."""
        return getattr(self.source, "bias", None)

    def base_frozen(self) -> bool:
        """True when every base parameter was frozen by the user (the adapter use)."""
        names = [n for n, _ in self.base.named_parameters()]
        return bool(names) and all(n in self.frozen_base_names for n in names)

    def remember_frozen_base(self) -> None:
        """Record base parameters frozen now by the user (not by a perfora phase)."""
        if self._trainable["base"]:
            self.frozen_base_names |= {n for n, p in self.base.named_parameters()
                                       if not p.requires_grad}

    def _generic_names(self) -> list[str]:
        return [n for n, _ in self.source.named_parameters()]

    def structure(self) -> dict:
        """JSON-able description of this layer, enough to rebuild it on a fresh model."""
        return {
            "num_dendrites": self.num_dendrites,
            "num_neurons": self.num_neurons,
            "neuron_axis": self.neuron_axis,
            "activation": self.activation,
            "grouped": self.grouped,
            "kind": self.kind,
            "base_type": type(self.source).__name__,
            **({"neurons": self.set_neurons()} if self.dendrite_mask is not None else {}),
        }

    def set_neurons(self) -> list[list[int]] | None:
        """Per dendrite set, the neurons it feeds; None when every set feeds every neuron."""
        if self.dendrite_mask is None:
            return None
        return [list(row) for row in self._set_lists]

    def _keep_lists(self, neurons: list[list[int]] | None) -> None:
        """Keep the mask's rows as Python index lists, so forward never reads the mask's data
        (torch.export cannot) and the lists stay in step with the buffer."""
        self._index_cache = None
        self._set_lists = None if neurons is None else [list(row) for row in neurons]

    def supports_partial_sets(self) -> bool:
        """True when a dendrite set may feed only some neurons (Linear, ungrouped Conv)."""
        return self.kind in ("linear", "conv") and self._groups() == 1

    def _set_mask(self, neurons: list[list[int] | None] | None, k: int) -> None:
        """Record which neurons each of the k sets feeds (None: all sets feed all neurons)."""
        self._index_cache = None
        if neurons is None or all(n is None for n in neurons):
            self.dendrite_mask = None
            self._keep_lists(None)
            return
        if not self.supports_partial_sets():
            raise PerforationError(f"a {self.kind} layer (groups={self._groups()}) cannot hold "
                                   "dendrite sets that feed only some neurons; use full sets")
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

    def _new_param(self, data: torch.Tensor, group: str) -> nn.Parameter:
        return nn.Parameter(data, requires_grad=self._trainable[group])

    def resize(self, num_dendrites: int,
               neurons: list[list[int] | None] | None = None) -> None:
        """Set the dendrite count to K, with zeroed weights (to be overwritten by a load).

        ``neurons``: per set, the neurons it feeds (None or omitted: every neuron)."""
        ref = self._reference()
        k, n = int(num_dendrites), self.num_neurons
        self._drop_candidate()
        self._set_mask(neurons if k else None, k)
        self.num_dendrites = k
        kw = {"device": ref.device, "dtype": ref.dtype}
        if k == 0:
            self.bank_weight = self.bank_bias = self.cascade = self.out_weight = None
            self.bank_params = nn.ParameterDict()
            return
        if self.kind == "generic":
            self.bank_params = nn.ParameterDict({
                _key(name): self._new_param(torch.zeros(k, *p.shape, **kw), "bank")
                for name, p in self.source.named_parameters()})
        else:
            src = self.source
            rows = sum(self._set_sizes())
            self.bank_weight = self._new_param(
                torch.zeros(rows, *src.weight.shape[1:], **kw), "bank")
            self.bank_bias = (None if src.bias is None else
                              self._new_param(torch.zeros(rows, **kw), "bank"))
        pairs = k * (k - 1) // 2
        self.cascade = self._new_param(torch.zeros(pairs, n, **kw), "cascade") if pairs else None
        self.out_weight = self._new_param(torch.zeros(k, n, **kw), "out")

    def grow(self, generator: torch.Generator | None = None, init: str = "default",
             scale: float = 1.0, *, neurons: list[int] | None = None,
             weights: Mapping[str, torch.Tensor] | None = None) -> None:
        """Add one dendrite with fresh random weights and zero v/w rows (output unchanged).

        ``neurons``: the neurons the new set feeds (None: all). ``weights``: its initial
        ``weight``/``bias`` rows (one row per fed neuron), e.g. chosen from the error signal;
        drawn at random when omitted. A pending candidate is merged into the bank first."""
        if self.has_candidate:
            self.merge_candidate()
        ref = self._reference()
        k, n = self.num_dendrites, self.num_neurons
        kw = {"device": ref.device, "dtype": ref.dtype}
        new = self._draw_dendrite(generator, init, scale)
        partial = neurons is not None and len(neurons) < n
        if partial or self.dendrite_mask is not None:
            old = self.set_neurons() or [None] * k
            self._set_mask([*old, sorted(neurons) if partial else None], k + 1)
        if partial:
            index = torch.as_tensor(sorted(neurons), dtype=torch.long)
            new = {key: t[index.to(t.device)] for key, t in new.items()}
        if weights is not None:
            for key, t in weights.items():
                if key not in new or new[key].shape != t.shape:
                    raise PerforationError(
                        f"grow(weights=...): {key!r} must have shape "
                        f"{tuple(new[key].shape) if key in new else '(none)'}, got "
                        f"{tuple(t.shape)}")
                new[key] = t.detach().to(**kw).clone()
        with torch.no_grad():
            if self.kind == "generic":
                old = dict(self.bank_params.items())
                self.bank_params = nn.ParameterDict({
                    key: self._new_param(
                        torch.cat([old[key].detach(), t.unsqueeze(0)]) if key in old
                        else t.unsqueeze(0), "bank")
                    for key, t in new.items()})
            else:
                self.bank_weight = self._new_param(
                    self._append_rows(self.bank_weight, new["weight"], k), "bank")
                if "bias" in new:
                    self.bank_bias = self._new_param(
                        self._append_rows(self.bank_bias, new["bias"], k), "bank")
            if k >= 1:
                rows = torch.zeros(k, n, **kw)
                prev = self.cascade.detach() if self.cascade is not None else None
                self.cascade = self._new_param(
                    rows if prev is None else torch.cat([prev, rows]), "cascade")
            v_prev = self.out_weight.detach() if self.out_weight is not None else None
            zero_v = torch.zeros(1, n, **kw)
            self.out_weight = self._new_param(
                zero_v if v_prev is None else torch.cat([v_prev, zero_v]), "out")
        self.num_dendrites = k + 1

    def _groups(self) -> int:
        return int(getattr(self.source, "groups", 1)) if self.kind == "conv" else 1

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

    def _draw_dendrite(self, generator: torch.Generator | None, init: str,
                       scale: float) -> dict[str, torch.Tensor]:
        """Draw one dendrite's weights on the CPU (reproducible on every rank)."""
        ref = self._reference()
        out: dict[str, torch.Tensor] = {}
        for name, p in self.source.named_parameters():
            if self.kind != "generic" and name not in ("weight", "bias"):
                continue
            shape = p.shape
            if init == "normal":
                t = torch.randn(shape, generator=generator)
            else:
                wshape = getattr(self.source, "weight", p).shape
                fan_in = math.prod(wshape[1:]) if len(wshape) > 1 else wshape[0]
                bound = 1.0 / math.sqrt(max(fan_in, 1))
                t = (torch.rand(shape, generator=generator) * 2 - 1) * bound
            key = name if self.kind != "generic" else _key(name)
            out[key] = (t * scale).to(device=ref.device, dtype=ref.dtype)
        return out

    # ------------------------------------------------------------------ candidate
    @property
    def banked(self) -> int:
        """Dendrites in the bank (all of them, less a candidate trained apart)."""
        return self.num_dendrites - int(self.has_candidate)

    def split_candidate(self) -> None:
        """Move the newest dendrite out of the bank into candidate parameters of its own.

        Its ``v`` row must still be zero: it stays in ``out_weight`` (unused while apart, so
        the parameter count does not change). :meth:`merge_candidate` undoes this exactly.
        """
        if self.has_candidate:
            return
        k = self.num_dendrites
        if k == 0:
            raise PerforationError("split_candidate() on a layer without dendrites; grow one "
                                   "first")
        if self.dendrite_mask is not None:
            raise PerforationError("split_candidate(): the correlation rule trains full "
                                   "dendrite sets; it cannot be combined with selective growth "
                                   "(grow_fraction < 1)")
        if bool(self.out_weight[k - 1].detach().ne(0).any()):
            raise PerforationError("split_candidate(): the newest dendrite already feeds the "
                                   "output (nonzero v row); a candidate must be split right "
                                   "after grow(), before v trains")
        with torch.no_grad():
            if self.kind == "generic":
                old = {key: p.detach() for key, p in self.bank_params.items()}
                self.bank_params = nn.ParameterDict(
                    {key: self._new_param(t[:k - 1].clone(), "bank") for key, t in old.items()}
                    if k > 1 else {})
                self.candidate_params = nn.ParameterDict(
                    {key: self._new_param(t[k - 1].clone(), "candidate")
                     for key, t in old.items()})
            else:
                for bank, cand in (("bank_weight", "candidate_weight"),
                                   ("bank_bias", "candidate_bias")):
                    t = getattr(self, bank)
                    if t is None:
                        continue
                    rows = t.detach().reshape(self._groups(), k, -1, *t.shape[1:])
                    setattr(self, bank, None if k == 1 else self._new_param(
                        rows[:, :k - 1].reshape(-1, *t.shape[1:]).clone(), "bank"))
                    setattr(self, cand, self._new_param(
                        rows[:, k - 1].reshape(-1, *t.shape[1:]).clone(), "candidate"))
            if k >= 2:
                rows, old_pairs = self.cascade.detach(), (k - 1) * (k - 2) // 2
                self.candidate_cascade = self._new_param(rows[old_pairs:].clone(), "candidate")
                self.cascade = (self._new_param(rows[:old_pairs].clone(), "cascade")
                                if old_pairs else None)
        self.has_candidate = True

    def merge_candidate(self) -> None:
        """Put the candidate back into the bank as the newest dendrite (exact)."""
        if not self.has_candidate:
            return
        merged = self._merged_tensors()
        if self.kind == "generic":
            cut = len("bank_params.")
            self.bank_params = nn.ParameterDict(
                {name[cut:]: self._new_param(t, "bank") for name, t in merged.items()
                 if name.startswith("bank_params.")})
        else:
            self.bank_weight = self._new_param(merged["bank_weight"], "bank")
            if "bank_bias" in merged:
                self.bank_bias = self._new_param(merged["bank_bias"], "bank")
        if "cascade" in merged:
            self.cascade = self._new_param(merged["cascade"], "cascade")
        self._drop_candidate()

    def _drop_candidate(self) -> None:
        for name in _CANDIDATE_NAMES:
            setattr(self, name, None)
        self.candidate_params = nn.ParameterDict()
        self.has_candidate = False

    def _merged_tensors(self) -> dict[str, torch.Tensor]:
        """Bank and cascade with the candidate merged back (new tensors, by local name)."""
        k = self.banked
        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            if self.kind == "generic":
                for key, c in self.candidate_params.items():
                    row = c.detach().unsqueeze(0)
                    out[f"bank_params.{key}"] = (
                        torch.cat([self.bank_params[key].detach(), row])
                        if key in self.bank_params else row.clone())
            else:
                out["bank_weight"] = self._append_rows(self.bank_weight,
                                                       self.candidate_weight.detach(), k)
                if self.candidate_bias is not None:
                    out["bank_bias"] = self._append_rows(self.bank_bias,
                                                         self.candidate_bias.detach(), k)
            if k >= 1:
                rows = self.candidate_cascade.detach()
                out["cascade"] = (rows.clone() if self.cascade is None
                                  else torch.cat([self.cascade.detach(), rows]))
        return out

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # the stored form is always merged: a load ends a candidate split (rules redo it)
        self.merge_candidate()
        stored = stored_dendrites(state_dict, prefix)
        mask = state_dict.get(prefix + "dendrite_mask")
        neurons = None if mask is None else [row.nonzero().flatten().tolist()
                                             for row in mask.cpu()]
        if stored is not None and not self._sharded() and (
                stored != self.num_dendrites or neurons != self.set_neurons()):
            # a grown state fits a model that has not grown (yet): take its dendrite count,
            # so Lightning's weight restore and ddp_spawn's copy-back keep the dendrites
            self.resize(stored, neurons)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if neurons is not None and self.dendrite_mask is not None:
            self._keep_lists(neurons)  # the mask just loaded

    def _sharded(self) -> bool:
        """True when FSDP2 made this layer's parameters DTensors (no in-place resize)."""
        return any(type(p).__name__ == "DTensor" for p in self.parameters())

    # ------------------------------------------------------------------ training
    def set_trainable(self, **groups: bool) -> None:
        """Set requires_grad per group: base, bank, cascade, out (v), candidate."""
        for group, flag in groups.items():
            if group not in PARAM_GROUPS:
                raise ValueError(f"unknown parameter group {group!r}; use {PARAM_GROUPS}")
            self._trainable[group] = bool(flag)
            if group == "base":
                for name, p in self.base.named_parameters():
                    p.requires_grad_(bool(flag) and name not in self.frozen_base_names)
                continue
            for p in self.group_parameters(group):
                p.requires_grad_(bool(flag))

    def group_parameters(self, group: str) -> list[nn.Parameter]:
        """The parameters of one group (base, bank, cascade, out, candidate)."""
        if group == "base":
            return list(self.base.parameters())
        if group == "bank":
            if self.kind == "generic":
                return list(self.bank_params.values())
            return [p for p in (self.bank_weight, self.bank_bias) if p is not None]
        if group == "cascade":
            return [self.cascade] if self.cascade is not None else []
        if group == "out":
            return [self.out_weight] if self.out_weight is not None else []
        if group == "candidate":
            if self.kind == "generic":
                return list(self.candidate_params.values())
            return [p for p in (getattr(self, n) for n in _CANDIDATE_NAMES) if p is not None]
        raise ValueError(f"unknown parameter group {group!r}; use {PARAM_GROUPS}")

    # ------------------------------------------------------------------ forward
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
        """D_k(x) for every k, each shaped like the neuron output.

        Linear/Conv banks stay one parameter tensor, but each dendrite is evaluated by its
        own call on its slice of it: D_k(x) then has the same shapes, hence the same bits,
        whatever K is (exact growth), and no buffer K times a feature map is allocated.
        """
        k = self.banked
        if self.kind in ("linear", "conv"):
            w, b = self._dendrite_weights()
            if self.kind == "linear":
                return [F.linear(x, w[i], b[i]) for i in range(k)]
            return [self.source._conv_forward(x, w[i], b[i]) for i in range(k)]
        names = self._generic_names()
        params = {name: self.bank_params[_key(name)] for name in names}

        def call(p: dict[str, torch.Tensor], inp: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(self.source, p, (inp,))

        stacked = torch.func.vmap(call, in_dims=(0, None))(params, x)
        return list(stacked.unbind(0))

    def _neuron_shape(self, ndim: int) -> list[int]:
        """Broadcast shape of a per-neuron vector against an output with ``ndim`` axes."""
        shape = [1] * ndim
        shape[self.neuron_axis % ndim] = self.num_neurons
        return shape

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if self.num_dendrites and self.kind == "conv" and not self.grouped \
                and x.dim() == len(self.source.kernel_size) + 1:
            # an unbatched input (C, *spatial) puts the neurons on axis 0: run it as a
            # batch of one, as the conv itself does
            return self.forward(x.unsqueeze(0), *args, **kwargs).squeeze(0)
        y = self.base(x, *args, **kwargs)
        if args or kwargs or not isinstance(y, torch.Tensor):
            # refused before any growth, so a run never trains on into a dead end
            raise PerforationError(
                f"a DendriticLayer needs a module that maps one tensor to one tensor; this "
                f"{type(self.source).__name__} was called with {1 + len(args)} positional "
                f"and {len(kwargs)} keyword argument(s) and returned "
                f"{type(y).__name__}. Perforate the layers inside it instead")
        if self.num_dendrites == 0:
            return y
        shape = self._neuron_shape(y.ndim)
        out, dendrites = self._mix(x, y, shape) if self.banked else (y, [])
        if self.has_candidate and self.candidate_tap is not None and torch.is_grad_enabled() \
                and any(p.requires_grad for p in self.group_parameters("candidate")):
            if _transformed():
                raise PerforationError(
                    "the correlation rule's dendrite phase trains this layer's candidate on "
                    "the error that an ordinary backward pass brings; under a torch.func "
                    "transform or forward-mode AD it would not learn. Run this phase with "
                    "loss.backward(), or use rule='gd'")
            out = self.candidate_tap(out, self._candidate_output(x, dendrites, shape))
        return out

    def _mix(self, x: torch.Tensor, y: torch.Tensor,
             shape: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """y + sum_k v[k] * d_k over the banked dendrites, and the d_k themselves (the d_k
        only where a candidate needs them: the fused path returns none)."""
        spec = self._fused_spec(x, y)
        if spec is not None:
            conv_forward = self.source._conv_forward if spec.kind == "conv" else None
            return FusedMix.apply(y, x, self.bank_weight, self.bank_bias, self.cascade,
                                  self.out_weight, spec, conv_forward), []
        act = _ACTIVATIONS[self.activation]
        pre = self._bank_outputs(x)
        k = len(pre)
        if self.dendrite_mask is not None:
            return self._mix_partial(pre, y, shape), []
        v_rows = self.out_weight[:k] if self.has_candidate else self.out_weight
        if k == 1:  # no cascade: y + v * act(D(x)) in two kernels
            d = act(pre[0])
            return torch.addcmul(y, v_rows.view(shape), d), [d]
        v = v_rows.view(k, *shape).unbind(0)
        w = self.cascade.view(-1, *shape).unbind(0)
        dendrites: list[torch.Tensor] = []
        out, row = y, 0
        for i, a in enumerate(pre):
            for j in range(i):
                a = torch.addcmul(a, w[row], dendrites[j])
                row += 1
            d = act(a)
            dendrites.append(d)
            out = torch.addcmul(out, v[i], d)
        return out, dendrites

    def _fused_spec(self, x: torch.Tensor, y: torch.Tensor) -> MixSpec | None:
        """The fused mix's static arguments when it applies here, else None (see kernels.py):
        eager mode, K >= 2 full sets, no candidate apart, an ungrouped Linear or zero-padded
        Conv, one dtype throughout, no autocast, no ``torch.func`` transform and no
        forward-mode AD (the node has neither a vmap rule nor a jvp: the autograd code has)."""
        if self.num_dendrites < 2 or self.kind == "generic" or self.has_candidate \
                or self.dendrite_mask is not None or self._groups() != 1 or _tracing() \
                or _transformed():
            return None  # K = 1: autograd's three nodes cost less than one Python node
        src = self.source
        axis = self.neuron_axis % y.ndim
        if self.kind == "conv":
            if src.padding_mode != "zeros" or isinstance(src.padding, str) \
                    or x.dim() != src.weight.dim() or axis != 1:
                return None
            conv = (tuple(src.stride), tuple(src.padding), tuple(src.dilation))
        else:
            if axis != y.ndim - 1 or x.dim() < 1:
                return None
            conv = None
        dtype = x.dtype
        if y.dtype != dtype or self.bank_weight.dtype != dtype \
                or self.out_weight.dtype != dtype or _autocasting(x.device.type):
            return None
        return MixSpec(self.kind, self.activation, conv)

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

    def _candidate_output(self, x: torch.Tensor, dendrites: list[torch.Tensor],
                          shape: list[int]) -> torch.Tensor:
        """The candidate's d from detached inputs: no error reaches the rest of the network."""
        xd = x.detach()
        if self.kind == "linear":
            a = F.linear(xd, self.candidate_weight, self.candidate_bias)
        elif self.kind == "conv":
            a = self.source._conv_forward(xd, self.candidate_weight, self.candidate_bias)
        else:
            params = {name: self.candidate_params[_key(name)] for name in self._generic_names()}
            a = torch.func.functional_call(self.source, params, (xd,))
        if dendrites:
            w = self.candidate_cascade.view(-1, *shape).unbind(0)
            for j, d in enumerate(dendrites):
                a = torch.addcmul(a, w[j], d.detach())
        return _ACTIVATIONS[self.activation](a)

    def extra_repr(self) -> str:
        return (f"neurons={self.num_neurons}, axis={self.neuron_axis}, "
                f"dendrites={self.num_dendrites}, activation={self.activation}, "
                f"bank={self.kind}{', candidate apart' if self.has_candidate else ''}")


def _tracing() -> bool:
    """True under torch.compile / torch.export / TorchScript tracing: the plain code then."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.jit.is_scripting()


def _transformed() -> bool:
    """True under a ``torch.func`` transform (grad, vmap, jvp, ...) or inside a forward-mode
    AD level: the plain code then, whose every op has batching and forward-mode rules."""
    return functorch_active() or getattr(torch.autograd.forward_ad, "_current_level", -1) >= 0


def _autocasting(device_type: str) -> bool:
    """Autocast on for this device type; False for a type autocast does not know (meta)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # older torch: no device argument
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()
    except RuntimeError:  # "unknown device type for autocast": it cannot be on
        return False


def _merged_state_hook(module: DendriticLayer, state_dict: dict, prefix: str,
                       local_metadata: dict) -> None:
    """state_dict post-hook: a layer with a candidate apart saves the merged bank."""
    if not module.has_candidate:
        return
    apart = (*_CANDIDATE_NAMES, "candidate_params")
    for key in [k for k in state_dict if k.startswith(prefix)]:
        if key[len(prefix):].split(".", 1)[0] in apart:
            del state_dict[key]
    for name, tensor in module._merged_tensors().items():
        state_dict[prefix + name] = tensor


def stored_dendrites(state_dict: Mapping[str, Any], prefix: str) -> int | None:
    """The dendrite count a saved layer had (None when the state holds no dendrites of it)."""
    out = state_dict.get(prefix + "out_weight")
    return None if out is None else int(out.shape[0])


def _key(name: str) -> str:
    return name.replace(".", "__")


def dendritic_layers(model: nn.Module) -> dict[str, DendriticLayer]:
    """Every DendriticLayer in a model, by dotted path (wrappers like DDP are looked through)."""
    inner = unwrap_model(model)
    return {name: m for name, m in inner.named_modules() if isinstance(m, DendriticLayer)}


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's model inside DataParallel / DistributedDataParallel / compile wrappers."""
    seen = 0
    while seen < 8:
        seen += 1
        if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel) or \
                type(model).__name__ in ("FullyShardedDataParallel",  # FSDP1: no import here
                                         "DeepSpeedEngine"):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        elif type(model).__name__ == "_FabricModule":  # Lightning Fabric's wrapper
            model = model._original_module
        else:
            break
    return model
