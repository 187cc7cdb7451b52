"""DendriticLayer: a wrapped layer plus one batched bank of K dendrites, grown exactly.

With K dendrites on neuron layer N (see DESIGN.md)::

    a_k = D_k(x) + sum_{j<k} w[k, j] * d_j      d_k = act(a_k)      y = N(x) + sum_k v[k] * d_k

All K dendrite layers of a wrapped layer live in one tensor (a K-times wider Linear/Conv
weight, or stacked parameters evaluated with one ``torch.func.vmap`` call for other
modules): one parameter, one optimizer entry, one gradient bucket. Linear/Conv dendrites are
evaluated slice by slice of that tensor: measured, this is as fast as one wide kernel (faster
at large batch: no K-sized zero-filled gradient buffers) and keeps growth bit-exact, which a
wider GEMM does not (it may round the old columns differently).
A new dendrite starts with zero ``v`` and ``w`` rows, so growth leaves the output unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ConversionError

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "relu": F.relu,
}
_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
PARAM_GROUPS = ("base", "bank", "cascade", "out")


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
            raise ConversionError(f"unknown activation {activation!r}; use one of "
                                  f"{sorted(_ACTIVATIONS)}")
        if num_neurons < 1:
            raise ConversionError(f"a dendritic layer needs at least one neuron, got "
                                  f"{num_neurons}")
        self.base = base
        self.grouped = grouped
        self.num_neurons = int(num_neurons)
        self.neuron_axis = int(neuron_axis)
        self.activation = activation
        self.kind = bank_kind(self.source)
        self.num_dendrites = 0
        self._trainable = dict.fromkeys(PARAM_GROUPS, True)
        # Parameters exist only when K > 0, so no tensor is ever left without a gradient.
        for name in ("bank_weight", "bank_bias", "cascade", "out_weight"):
            self.register_parameter(name, None)
        self.bank_params = nn.ParameterDict()

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
        raise ConversionError("cannot perforate a module without parameters")

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
        }

    def _new_param(self, data: torch.Tensor, group: str) -> nn.Parameter:
        return nn.Parameter(data, requires_grad=self._trainable[group])

    def resize(self, num_dendrites: int) -> None:
        """Set the dendrite count to K, with zeroed weights (to be overwritten by a load)."""
        ref = self._reference()
        k, n = int(num_dendrites), self.num_neurons
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
            self.bank_weight = self._new_param(
                torch.zeros(k * src.weight.shape[0], *src.weight.shape[1:], **kw), "bank")
            self.bank_bias = (None if src.bias is None else
                              self._new_param(torch.zeros(k * src.bias.shape[0], **kw), "bank"))
        pairs = k * (k - 1) // 2
        self.cascade = self._new_param(torch.zeros(pairs, n, **kw), "cascade") if pairs else None
        self.out_weight = self._new_param(torch.zeros(k, n, **kw), "out")

    def grow(self, generator: torch.Generator | None = None, init: str = "default",
             scale: float = 1.0) -> None:
        """Add one dendrite with fresh random weights and zero v/w rows (output unchanged)."""
        ref = self._reference()
        k, n = self.num_dendrites, self.num_neurons
        kw = {"device": ref.device, "dtype": ref.dtype}
        new = self._draw_dendrite(generator, init, scale)
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
                    self._append_rows(self.bank_weight, new["weight"]), "bank")
                if "bias" in new:
                    self.bank_bias = self._new_param(
                        self._append_rows(self.bank_bias, new["bias"]), "bank")
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

    def _append_rows(self, bank: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
        """Append one dendrite's rows to the bank, keeping conv groups contiguous."""
        if bank is None:
            return rows.clone()
        g, k = self._groups(), self.num_dendrites
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

    # ------------------------------------------------------------------ training
    def set_trainable(self, **groups: bool) -> None:
        """Set requires_grad per group: base, bank, cascade, out (v)."""
        for group, flag in groups.items():
            if group not in PARAM_GROUPS:
                raise ValueError(f"unknown parameter group {group!r}; use {PARAM_GROUPS}")
            self._trainable[group] = bool(flag)
            for p in self.group_parameters(group):
                p.requires_grad_(bool(flag))

    def group_parameters(self, group: str) -> list[nn.Parameter]:
        """The parameters of one group (base, bank, cascade, out)."""
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
        raise ValueError(f"unknown parameter group {group!r}; use {PARAM_GROUPS}")

    # ------------------------------------------------------------------ forward
    def _dendrite_weights(self) -> tuple[list, list]:
        """Each dendrite's (weight, bias): views of the bank, copies only for grouped convs."""
        k, g = self.num_dendrites, self._groups()
        bias = self.bank_bias
        if k == 1:
            return [self.bank_weight], [bias]
        if g == 1:
            n = self.num_neurons
            return (list(self.bank_weight.split(n)),
                    [None] * k if bias is None else list(bias.split(n)))
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
        k = self.num_dendrites
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
        y = self.base(x, *args, **kwargs)
        k = self.num_dendrites
        if k == 0:
            return y
        if args or kwargs:
            raise ConversionError("a DendriticLayer with dendrites takes one tensor input; "
                                  "wrap a module that maps one tensor to one tensor")
        act = _ACTIVATIONS[self.activation]
        shape = self._neuron_shape(y.ndim)
        pre = self._bank_outputs(x)
        if k == 1:  # no cascade: y + v * act(D(x)) in two kernels
            return torch.addcmul(y, self.out_weight.view(shape), act(pre[0]))
        v = self.out_weight.view(k, *shape).unbind(0)
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
        return out

    def extra_repr(self) -> str:
        return (f"neurons={self.num_neurons}, axis={self.neuron_axis}, "
                f"dendrites={self.num_dendrites}, activation={self.activation}, "
                f"bank={self.kind}")


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
        if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            break
    return model
