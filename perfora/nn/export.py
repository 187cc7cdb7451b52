"""Export a perforated model as plain PyTorch: no perfora class is left in it.

Every :class:`DendriticLayer` is replaced, in a copy of the model, by either its original
layer (no dendrites) or a ``torch.fx.GraphModule`` that computes the same function::

    y = N(x) + sum_k v[k] * d_k      d_k = act(D_k(x) + sum_{j<k} w[k, j] * d_j)

with all K dendrite layers in one Linear/Conv (one GEMM), the ``v`` and ``w`` rows shaped to
broadcast, and selective sets computed on their own neurons only (``index_add``), so the
copy holds exactly the parameters that computation needs. A GraphModule pickles as its
generated code plus torch modules: loading the exported model needs torch and the user's own
model classes, not perfora. ``torch.export``, ``torch.compile`` and ONNX see only torch ops.
"""


import copy  # (no `from __future__ import annotations`: fx would record string types)
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from ..errors import ExportError
from .blocks import plain_modules
from .chunked import forward_index
from .export_config import grown_widths, update_exported_config
from .fused_record import drop_record
from .layers import DendriticLayer, dendritic_layers, unwrap_model
from .plain_keys import remove_plain_key_hook
from .resize_head import remove_resize_hook
from .saved_widths import remove_width_hook
from .tied import rename_tied_keys

_ACTIVATION_FUNCTIONS = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": F.relu}


def _copy_model(model: nn.Module) -> nn.Module:
    """A deep copy. A tensor that a forward pass left in a module's attributes with autograd
    history (LeViT's attention bias cache, filled in eval mode) is copied detached: deepcopy
    refuses such tensors ("only graph leaves support the deepcopy protocol")."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        for value in module.__dict__.values():
            items = value.values() if isinstance(value, dict) else \
                value if isinstance(value, (list, tuple)) else (value,)
            for item in items:
                if isinstance(item, torch.Tensor) and item.grad_fn is not None:
                    memo[id(item)] = item.detach().clone()
    return copy.deepcopy(model, memo)


def export(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every dendritic layer as plain torch modules (in eval mode).

    The copy computes the same outputs (within float rounding: the dendrites run as one
    GEMM), holds no perfora class, and keeps the training-only state (candidates, masks,
    optimizer hooks) out. The original model is not changed. A Hugging Face model's config
    (a copy) takes the feed-forward width its layers grew to (``intermediate_size``,
    ``n_inner``, ``d_ff``), so ``save_pretrained`` and ``from_pretrained`` round-trip; where
    layers grew to different widths no config can say so, and ``export`` warns."""
    inner = unwrap_model(model)
    copied = _copy_model(inner)
    orders = {path: forward_index(layer.source) for path, layer in dendritic_layers(copied).items()}
    exported = plain_modules(copied)  # widened layers: one plain call each
    for path, layer in sorted(dendritic_layers(exported).items(), key=lambda kv: -len(kv[0])):
        # the copy's own base, not a copy of it: a weight tied to another module (a tied
        # lm_head named in paths=) stays that module's Parameter, as in the live model
        replacement = export_layer(layer, copy_base=False, order=orders.get(path))
        parent_path, _, name = path.rpartition(".")
        parent = exported.get_submodule(parent_path) if parent_path else exported
        setattr(parent, name, replacement)
        if layer.num_dendrites == 0:  # the tied-weight keys name the plain layer again
            rename_tied_keys(exported, f"{path}.base", path)
    if isinstance(exported, DendriticLayer):
        exported = export_layer(exported, copy_base=False)
    _restore_plain_attention(exported)
    remove_width_hook(exported)
    remove_plain_key_hook(exported)
    remove_resize_hook(exported)
    update_exported_config(exported, grown_widths(inner))
    drop_record(exported)
    return exported.eval()


def export_layer(layer: DendriticLayer, copy_base: bool = True,
                 order: torch.Tensor | None = None) -> nn.Module:
    """One dendritic layer as plain torch: its base layer, or a traced GraphModule
    (``copy_base=False``: holding the layer's own base module, not a copy of it). ``order``:
    for a widened fused gate-and-up layer whose base rows were put in forward order, the row
    each output came from (its dendrites are in the rows' stored order)."""
    if layer.num_dendrites == 0:
        return copy.deepcopy(layer.base) if copy_base else layer.base
    computation = _DendriteComputation(layer, copy_base, order)
    graph = torch.fx.Tracer().trace(computation)
    exported = torch.fx.GraphModule(computation, graph, class_name="ExportedDendriticLayer")
    _answer_like_the_base(exported, exported.get_submodule("base"))
    return exported


_LAYER_SETTINGS = ("in_features", "out_features", "in_channels", "out_channels",
                   "kernel_size", "stride", "padding", "dilation", "groups", "padding_mode",
                   "transposed", "output_padding")
"""What model code reads from a Linear or Conv besides calling it (e.g. ``conv.stride``)."""


def _answer_like_the_base(exported: nn.Module, base: nn.Module) -> None:
    """Let model code read the layer's settings and its ``weight``/``bias`` (T5 and ViT read
    ``layer.weight.dtype``) from the exported layer, as it could from the layer it replaces.

    The tensors are plain instance attributes that alias the base's parameters, so they are
    not registered twice: the state dict and ``parameters()`` are unchanged."""
    for name in _LAYER_SETTINGS:
        if hasattr(base, name):
            setattr(exported, name, getattr(base, name))
    for name in ("weight", "bias"):
        if isinstance(getattr(base, name, None), torch.Tensor):
            exported.__dict__[name] = getattr(base, name)


class _DendriteComputation(nn.Module):
    """The inference computation of one layer, written to be traced by torch.fx."""

    def __init__(self, layer: DendriticLayer, copy_base: bool = True,
                 order: torch.Tensor | None = None) -> None:
        super().__init__()
        self.reorder = order is not None  # the base's outputs to the dendrites' order, and back
        if order is not None:
            device = layer.source.weight.device
            self.register_buffer("to_forward", order.to(device))
            self.register_buffer("to_stored", torch.argsort(order).to(device))
        state = layer.state_dict()  # the merged form: a candidate trained apart is put back
        k, n = layer.num_dendrites, layer.num_neurons
        self.k, self.act = k, _ACTIVATION_FUNCTIONS[layer.activation]
        self.base = copy.deepcopy(layer.base) if copy_base else layer.base
        self.kind = layer.kind
        self.axis = layer.neuron_axis
        self.ndim = _output_ndim(layer)
        self.neurons = layer.set_neurons()
        sizes = [len(s) for s in self.neurons] if self.neurons else [n] * k
        self.sizes = sizes
        self._build_bank(layer, state, sum(sizes))
        out = state["out_weight"].detach()
        cascade = state.get("cascade")
        pairs = [(i, j) for i in range(k) for j in range(i)]
        if self.neurons is None:
            for i in range(k):
                self.register_parameter(f"v{i}", nn.Parameter(self._shaped(out[i]), False))
            for row, (i, j) in enumerate(pairs):
                self.register_parameter(f"w{i}_{j}",
                                        nn.Parameter(self._shaped(cascade[row]), False))
            return
        index = [torch.as_tensor(s, dtype=torch.long) for s in self.neurons]
        for i in range(k):
            self.register_buffer(f"index{i}", index[i].to(out.device))
            self.register_parameter(f"v{i}", nn.Parameter(self._shaped(out[i, index[i]]), False))
        for row, (i, j) in enumerate(pairs):
            pos = torch.full((n,), len(index[j]), dtype=torch.long)
            pos[index[j]] = torch.arange(len(index[j]))
            self.register_buffer(f"where{i}_{j}", pos[index[i]].to(out.device))
            self.register_parameter(f"w{i}_{j}", nn.Parameter(
                self._shaped(cascade[row, index[i]]), False))

    def _build_bank(self, layer: DendriticLayer, state: dict, rows: int) -> None:
        """All K dendrite layers as one module (Linear/Conv) or K copies (other modules)."""
        source = layer.source
        if self.kind == "generic":
            copies = []
            for i in range(self.k):
                module = copy.deepcopy(source)
                with torch.no_grad():
                    for name, p in module.named_parameters():
                        p.copy_(state[f"bank_params.{name.replace('.', '__')}"][i])
                copies.append(module)
            self.bank = nn.ModuleList(copies)
            return
        bank = copy.deepcopy(source)
        weight, bias = state["bank_weight"].detach(), state.get("bank_bias")
        bank.weight = nn.Parameter(weight.clone(), requires_grad=False)
        bank.bias = None if bias is None else nn.Parameter(bias.detach().clone(), False)
        if self.kind == "linear":
            bank.out_features = rows
        else:
            bank.out_channels = rows
        self.groups = layer._groups()
        self.bank = bank

    def _shaped(self, vector: torch.Tensor) -> torch.Tensor:
        """A per-neuron vector shaped to broadcast along the neuron axis."""
        vector = vector.detach().clone()
        if self.axis >= 0 and self.ndim is None:
            return vector  # applied after moving the neuron axis last
        axis = self.axis if self.axis < 0 else self.axis - self.ndim
        return vector.reshape(-1, *([1] * (-axis - 1)))

    def _last(self) -> bool:
        return self.axis >= 0 and self.ndim is None

    def _pre_activations(self, x: torch.Tensor) -> list:
        """D_k(x) for every k, on the neurons each set feeds."""
        axis = self._axis()
        if self.kind == "generic":
            outs = [module(x) for module in self.bank]
            return [o.movedim(self.axis, -1) for o in outs] if self._last() else outs
        # the op the live layer runs on the bank (the class's own forward, e.g. a weight
        # standardization in a Conv2d subclass, applies to the base only)
        if self.kind == "conv":
            z = self.bank._conv_forward(x, self.bank.weight, self.bank.bias)
        else:
            z = F.linear(x, self.bank.weight, self.bank.bias)
        if self.kind == "conv" and self.groups > 1:
            g, per = self.groups, self.sizes[0] // self.groups
            z = z.unflatten(1, (g, self.k, per))
            return [z.select(2, i).flatten(1, 2) for i in range(self.k)]
        if self.k == 1:
            return [z]
        parts = z.split(self.sizes, dim=axis)
        return [parts[i] for i in range(self.k)]

    def _axis(self) -> int:
        if self._last():
            return -1
        return self.axis if self.axis < 0 or self.ndim is None else self.axis - self.ndim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self._last():
            y = y.movedim(self.axis, -1)
        if self.reorder:
            y = y.index_select(-1, self.to_stored)
        pre = self._pre_activations(x)
        out = self._mix_full(pre, y) if self.neurons is None else self._mix_partial(pre, y)
        out = out.to(y.dtype)  # the base's dtype, as the live layer keeps it (autocast)
        if self.reorder:
            out = out.index_select(-1, self.to_forward)
        return out.movedim(-1, self.axis) if self._last() else out

    def _mix_full(self, pre: list, y: torch.Tensor) -> torch.Tensor:
        dendrites = []
        out = y
        for i, a in enumerate(pre):
            for j in range(i):
                a = a + getattr(self, f"w{i}_{j}") * dendrites[j]
            d = self.act(a)
            dendrites.append(d)
            out = out + getattr(self, f"v{i}") * d
        return out

    def _mix_partial(self, pre: list, y: torch.Tensor) -> torch.Tensor:
        axis = self._axis()
        pad = [0, 0] * (-axis - 1) + [0, 1]  # one zero slot after the neurons of a set
        padded = []
        out = y
        for i, a in enumerate(pre):
            for j in range(i):
                a = a + getattr(self, f"w{i}_{j}") * padded[j].index_select(
                    axis, getattr(self, f"where{i}_{j}"))
            d = self.act(a)
            padded.append(F.pad(d, pad))
            term = getattr(self, f"v{i}") * d
            # in the promoted dtype, as the live layer adds it (under autocast a bf16 output
            # meets float32 v rows, and index_add refuses mixed dtypes)
            dtype = torch.promote_types(out.dtype, term.dtype)
            out = out.to(dtype).index_add(axis, getattr(self, f"index{i}"), term.to(dtype))
        return out


def _output_ndim(layer: DendriticLayer) -> int | None:
    """The rank of the layer's output when the layer type fixes it (Conv), else None."""
    source = layer.source
    for dims, cls in ((3, nn.Conv1d), (4, nn.Conv2d), (5, nn.Conv3d)):
        if isinstance(source, cls):
            return dims
    if layer.kind == "linear" and layer.neuron_axis < 0:
        return None
    if layer.kind == "linear":
        raise ExportError("cannot export a Linear layer whose neuron axis is not the "
                          "last one")
    return None


def _restore_plain_attention(model: nn.Module) -> None:
    """A routed attention (a perfora class) whose projection has no dendrites becomes a plain
    ``nn.MultiheadAttention`` again; one with dendrites cannot be expressed in plain torch."""
    from .attention import _RoutedAttentionMixin

    for path, module in list(model.named_modules()):
        if not isinstance(module, _RoutedAttentionMixin):
            continue
        if type(module.out_proj) in (nn.Linear, nn.modules.linear.NonDynamicallyQuantizableLinear):
            module.__class__ = next(c for c in type(module).__mro__
                                    if c is not _RoutedAttentionMixin
                                    and not issubclass(c, _RoutedAttentionMixin))
            continue
        raise ExportError(
            f"cannot export {path!r}: its output projection holds dendrites, which "
            "nn.MultiheadAttention cannot call (it reads out_proj.weight itself). Leave "
            "attention projections unwrapped (the default) to export the model")
