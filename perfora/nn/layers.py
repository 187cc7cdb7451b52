"""DendriticLayer: a wrapped layer plus one batched bank of K dendrites, grown exactly.

With K dendrites on neuron layer N (``D_k`` a layer shaped like N, ``w`` the cascade between
dendrites, ``v`` their output weights, one value per neuron each)::

    a_k = D_k(x) + sum_{j<k} w[k, j] * d_j      d_k = act(a_k)      y = N(x) + sum_k v[k] * d_k

All K dendrite layers of a wrapped layer live in one tensor: one parameter, one optimizer
entry, one gradient bucket. How they are batched is the layer's *bank kind*, one class each
(:func:`bank_kind` chooses, ``DendriticLayer(module, ...)`` builds the right one):

* ``linear`` and ``conv`` (:mod:`perfora.nn.linear`, :mod:`perfora.nn.conv`, sharing
  :mod:`perfora.nn.row_bank`): a K-times taller Linear/Conv weight, evaluated slice by slice.
  Measured, this is as fast as one wide kernel (faster at large batch: no K-sized zero-filled
  gradient buffers) and keeps growth bit-exact, which a wider GEMM does not (it may round the
  old columns differently). In eager training with K >= 2 full sets on a Linear or ungrouped
  Conv the mix runs as one autograd node with a hand-written backward
  (:mod:`perfora.nn.kernels`). A dendrite *set* may feed only some neurons (selective
  growth): its bank rows then exist only for those neurons.
* ``generic`` (:mod:`perfora.nn.generic`): any other module, its parameters stacked on a
  new first axis and evaluated with one ``torch.func.vmap`` call.

:class:`DendriticLayer` holds what every kind shares: the cascade and output weights, the
``dendrite_mask`` buffer (sets x neurons: which neurons each set feeds, saved in the state
dict so a state alone rebuilds the structure), resizing and exact growth (a new dendrite
starts with zero ``v`` and ``w`` rows, so growth leaves the output unchanged), loading a
state, and the forward pass with its autograd mix; with two mixins, the parameter groups
(:mod:`perfora.nn.param_groups`) and the candidate trained apart (:mod:`perfora.nn.candidate`).

The candidate, the newest dendrite that the correlation rule trains apart, gets
``x.detach()`` and the detached outputs of the older dendrites, is not added to the output
(its ``v`` row is zero), and is handed with the output to the rule's ``candidate_tap``,
which gives it a gradient of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PerforationError
from .block_mix import mix_by_blocks, mix_from_pre, widened_blocks
from .candidate import CANDIDATE_NAMES, CandidateApart, merged_state_hook
from .chunked import forward_order, stored_order
from .kernels import functorch_active
from .param_groups import PARAM_GROUPS, ParameterGroups
from .plain_keys import adopt_plain_keys

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "relu": F.relu,
}
_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


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


class DendriticLayer(ParameterGroups, CandidateApart, nn.Module):
    """A module plus a growable bank of dendrites that feed its neurons.

    ``base`` is the original module (or a ``Sequential(layer, norm)`` group whose first
    element is the layer the dendrites copy). ``neuron_axis`` is the axis of the output
    that indexes neurons: -1 for Linear, 1 for Conv, anything for other modules.

    ``DendriticLayer(base, ...)`` returns the subclass of the layer's bank kind
    (:func:`bank_kind`): ``LinearDendriticLayer``, ``ConvDendriticLayer`` or
    ``GenericDendriticLayer``. This class holds what they share; each kind says how its bank
    is laid out, grown, split for a candidate and evaluated.
    """

    kind: ClassVar[str]
    """How the dendrites are batched: 'linear', 'conv' or 'generic' (saved in checkpoints)."""
    _kinds: ClassVar[dict[str, type[DendriticLayer]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in vars(cls):  # a bank kind (wrapper subclasses, e.g. FSDP2's, inherit it)
            DendriticLayer._kinds[cls.kind] = cls

    def __new__(cls, base: nn.Module | None = None, *args: Any, **kwargs: Any) -> DendriticLayer:
        if cls is DendriticLayer and base is not None:
            source = base[0] if kwargs.get("grouped") else base  # type: ignore[index]
            cls = DendriticLayer._kinds[bank_kind(source)]
        return super().__new__(cls)

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
        if bank_kind(self.source) != self.kind:
            raise PerforationError(f"a {type(self).__name__} cannot hold a "
                                   f"{type(self.source).__name__}; use DendriticLayer(...)")
        self.num_neurons = int(num_neurons)
        self.neuron_axis = int(neuron_axis)
        self.activation = activation
        self.num_dendrites = 0
        self._trainable = dict.fromkeys(PARAM_GROUPS, True)
        # base parameters the user froze: no rule phase, growth or load unfreezes them
        self.frozen_base_names: set[str] = {n for n, p in base.named_parameters()
                                            if not p.requires_grad}
        # Parameters exist only when K > 0, so no tensor is ever left without a gradient.
        for name in ("bank_weight", "bank_bias", "cascade", "out_weight", *CANDIDATE_NAMES):
            self.register_parameter(name, None)
        self.bank_params = nn.ParameterDict()
        self.candidate_params = nn.ParameterDict()
        self.has_candidate = False
        # set by a learning rule: (output, candidate output) -> output, identity in forward
        self.candidate_tap: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        self.register_buffer("dendrite_mask", None)  # (sets, neurons) bool; None: every set full
        self._index_cache: tuple | None = None
        self._set_lists: list[list[int]] | None = None  # the mask's rows as index lists
        self.register_state_dict_post_hook(merged_state_hook)
        self.forget_calls()

    def forget_calls(self) -> None:
        """Reset :attr:`seen_call` and :attr:`seen_training_call`, which forward sets.

        They tell usage checks whether the layer ran (and in training) since the reset,
        without a hook: forward only writes them, so ``torch.compile`` keeps no guard on
        their values and resetting them never recompiles."""
        self.seen_call = False
        self.seen_training_call = False

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
            # the widenings of this layer (perfora.nn.widening), replayed on a narrow model
            **({"widened": self.widenings} if getattr(self, "widenings", None) else {}),
            **({"base_blocks": _base_blocks(self.source)} if _base_blocks(self.source) else {}),
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
        return False

    def _groups(self) -> int:
        """Conv groups of the bank (1 for every kind but a grouped Conv)."""
        return 1

    def _set_mask(self, neurons: list[list[int] | None] | None, k: int) -> None:
        """Record which neurons each of the k sets feeds (None: all sets feed all neurons);
        kinds that support partial sets build the mask (see :mod:`perfora.nn.row_bank`)."""
        self._index_cache = None
        if neurons is None or all(n is None for n in neurons):
            self.dendrite_mask = None
            self._keep_lists(None)
            return
        raise PerforationError(f"a {self.kind} layer (groups={self._groups()}) cannot hold "
                               "dendrite sets that feed only some neurons; use full sets")

    # ------------------------------------------------------------------ growth
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
        self._new_bank(k, kw)
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
            self._append_bank(new, k)
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

    def _draw_dendrite(self, generator: torch.Generator | None, init: str,
                       scale: float) -> dict[str, torch.Tensor]:
        """Draw one dendrite's weights on the CPU (reproducible on every rank)."""
        ref = self._reference()
        out: dict[str, torch.Tensor] = {}
        for name, p in self.source.named_parameters():
            key = self._bank_key(name)
            if key is None:
                continue
            shape = p.shape
            if init == "normal":
                t = torch.randn(shape, generator=generator)
            else:
                wshape = getattr(self.source, "weight", p).shape
                fan_in = math.prod(wshape[1:]) if len(wshape) > 1 else wshape[0]
                bound = 1.0 / math.sqrt(max(fan_in, 1))
                t = (torch.rand(shape, generator=generator) * 2 - 1) * bound
            out[key] = (t * scale).to(device=ref.device, dtype=ref.dtype)
        return out

    # what each bank kind implements
    def _bank_key(self, name: str) -> str | None:
        """The key of the source's parameter ``name`` in one drawn dendrite (None: unbanked)."""
        raise NotImplementedError

    def _new_bank(self, k: int, kw: dict[str, Any]) -> None:
        """A zeroed bank for k dendrites (``kw``: device and dtype)."""
        raise NotImplementedError

    def _append_bank(self, new: dict[str, torch.Tensor], k: int) -> None:
        """Append one dendrite's tensors (from :meth:`_draw_dendrite`) to a bank of k."""
        raise NotImplementedError

    def _bank_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """D_k(x) for every banked dendrite, each shaped like the neuron output."""
        raise NotImplementedError

    def _candidate_pre(self, x: torch.Tensor) -> torch.Tensor:
        """The candidate's D(x), from its parameters apart."""
        raise NotImplementedError

    # ------------------------------------------------------------------ state dict
    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        adopt_plain_keys(self, state_dict, prefix)  # a plain model's checkpoint fits too
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

    # ------------------------------------------------------------------ forward
    def _neuron_shape(self, ndim: int) -> list[int]:
        """Broadcast shape of a per-neuron vector against an output with ``ndim`` axes."""
        shape = [1] * ndim
        shape[self.neuron_axis % ndim] = self.num_neurons
        return shape

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        self.seen_call = True  # written, never read here (see forget_calls)
        if self.training and torch.is_grad_enabled():
            self.seen_training_call = True
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
        y = stored_order(self.source, y, self.neuron_axis)  # a fused gate-and-up layer's
        # dendrites feed its neurons in the rows' order (chunked.py): back to it, and after
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
        # under autocast a bf16 output meets float32 v rows: the output keeps the base's dtype
        out = out if out.dtype == y.dtype else out.to(y.dtype)
        return forward_order(self.source, out, self.neuron_axis)

    def _mix(self, x: torch.Tensor, y: torch.Tensor,
             shape: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """y + sum_k v[k] * d_k over the banked dendrites in autograd ops, and the d_k
        themselves (a candidate apart reads them)."""
        pre = self._bank_outputs(x)
        v_rows = self.out_weight[:len(pre)] if self.has_candidate else self.out_weight
        mix = partial(mix_from_pre, _ACTIVATIONS[self.activation])
        blocks = widened_blocks(self.source)
        if blocks is not None:  # elementwise work per block too: see mix_by_blocks
            return mix_by_blocks(mix, pre, y, v_rows, self.cascade,
                                 self.neuron_axis % y.ndim, blocks, shape)
        return mix(pre, y, v_rows, self.cascade, shape)

    def _candidate_output(self, x: torch.Tensor, dendrites: list[torch.Tensor],
                          shape: list[int]) -> torch.Tensor:
        """The candidate's d from detached inputs: no error reaches the rest of the network."""
        a = self._candidate_pre(x.detach())
        if dendrites:
            w = self.candidate_cascade.view(-1, *shape).unbind(0)
            for j, d in enumerate(dendrites):
                a = torch.addcmul(a, w[j], d.detach())
        return _ACTIVATIONS[self.activation](a)

    def extra_repr(self) -> str:
        return (f"neurons={self.num_neurons}, axis={self.neuron_axis}, "
                f"dendrites={self.num_dendrites}, activation={self.activation}, "
                f"bank={self.kind}{', candidate apart' if self.has_candidate else ''}")


def _base_blocks(source: nn.Module) -> dict[str, list[int]] | None:
    """The widths a base layer had at each widening (None: never widened)."""
    blocks = {side: list(getattr(source, f"{side}_blocks", None) or []) for side in ("out", "in")}
    return blocks if any(len(b) > 1 for b in blocks.values()) else None


def _transformed() -> bool:
    """True under a ``torch.func`` transform (grad, vmap, jvp, ...) or inside a forward-mode
    AD level: the plain code then, whose every op has batching and forward-mode rules."""
    return functorch_active() or getattr(torch.autograd.forward_ad, "_current_level", -1) >= 0


def stored_dendrites(state_dict: Mapping[str, Any], prefix: str) -> int | None:
    """The dendrite count a saved layer had (None when the state holds no dendrites of it)."""
    out = state_dict.get(prefix + "out_weight")
    return None if out is None else int(out.shape[0])


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
