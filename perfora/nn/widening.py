"""Grow neurons: a layer gains k outputs, and everything that reads them gains zeroed inputs.

``widen(model, "path", k)`` adds k output neurons to a Linear, a Conv (groups=1), Hugging
Face's ``Conv1D`` or a :class:`DendriticLayer` over one of them, found with its consumers by
:func:`perfora.nn.consumers.plan_widening`. The new incoming weights are random (the layer's
own init) or given (``init=``, e.g. :func:`gradmax_init`), their biases zero; every consumer
gains k zero input columns (k times the spatial size after a ``Flatten``), a channel norm on the
way gains k channels with neutral statistics (mean 0, variance 1, weight 1, bias 0), and an
activation or pooling on the way is applied block by block (:mod:`perfora.nn.blocks`). Since
the new outgoing columns are zero and every old piece is computed as before, the model's
output is bit-for-bit unchanged; the new columns get a gradient from the next backward pass.

A dendritic producer's full dendrite sets gain random bank rows for the new neurons with zero
``v`` and cascade entries; when its sets feed chosen neurons (a ``dendrite_mask``), the new
neurons are fed by none (a generic layer over GPT-2's Conv1D: :mod:`.generic_widening`). A
dendritic consumer gains zero columns in its base and its bank.
Each widening is recorded on the producer (``widenings``), saved in its structure spec and
replayed by :func:`replay_widenings` when a checkpoint is loaded into a narrow model.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from ..errors import PerforationError
from .blocks import (
    CHANNEL_NORMS,
    CONV_TYPES,
    TRANSPOSED_CONVS,
    Blockwise,
    is_hf_conv1d,
    make_blocked,
    same_layout,
)
from .consumers import LayerPlan, plan_widening
from .fused_record import note_fused_widenings
from .generic_widening import grow_generic_inputs, grow_generic_outputs
from .layers import DendriticLayer, unwrap_model
from .narrowing import change_neuron_count, narrow_widenings
from .norm_widening import neuron_multiple, widen_norm
from .plan_types import is_grouped_conv, is_width_exact


def gradmax_init(x: torch.Tensor, g_y: torch.Tensor, k: int, scale: float) -> torch.Tensor:
    """GradMax (Evci et al. 2022): the k incoming weight rows whose new units, with zero
    outgoing weights, get the largest gradient on those outgoing weights.

    ``x``: the producer's inputs, [N, in] (batch and positions flattened; for a Conv, its
    unfolded patches). ``g_y``: the loss gradient at the consumer's output for the same N
    positions, [N, out]. For units linear around 0 the outgoing weights' gradient is
    ``M @ W_new.T`` with ``M = g_y.T @ x / N``; its norm, for rows of norm ``scale``, is
    largest along M's top-k right singular vectors. Returns [k, in], each row of norm
    ``scale`` (rows beyond M's rank are random directions orthogonal to the others)."""
    if x.dim() != 2 or g_y.dim() != 2 or x.shape[0] != g_y.shape[0]:
        raise PerforationError(f"gradmax_init needs x [N, in] and g_y [N, out] over the same "
                               f"N, got {tuple(x.shape)} and {tuple(g_y.shape)}")
    if k < 1:
        raise PerforationError(f"gradmax_init: k must be at least 1, got {k}")
    m = g_y.double().T @ x.double() / max(x.shape[0], 1)
    return gradmax_rows(m, k, scale).to(x.dtype)


def gradmax_rows(m: torch.Tensor, k: int, scale: float,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """The GradMax rows from ``M = E[g_y x^T]`` ([out, in]): its top-k right singular vectors,
    each of norm ``scale`` (float64; rows beyond M's rank are random directions, drawn from
    ``generator``, orthogonal to the others)."""
    m = m.double()
    _, s, vh = torch.linalg.svd(m, full_matrices=True)
    rank = int((s > s.max().clamp_min(1e-300) * 1e-10).sum()) if s.numel() else 0
    rows = vh[:min(k, rank)]
    if rows.shape[0] < k:  # fill with random directions orthogonal to those chosen
        extra = torch.randn(k - rows.shape[0], m.shape[1], dtype=torch.float64,
                            generator=generator)
        if rows.shape[0]:
            extra = extra - extra @ rows.T @ rows
        q, _ = torch.linalg.qr(extra.T)
        rows = torch.cat([rows, q.T[:k - rows.shape[0]]])
    if rows.shape[0] < k:  # more new units than input dimensions: random directions
        rows = torch.cat([rows, torch.randn(k - rows.shape[0], m.shape[1], dtype=torch.float64,
                                            generator=generator)])
    rows = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return rows * scale


def widen(model: nn.Module, layer: str | LayerPlan, k: int,
          init: torch.Tensor | Mapping[str, torch.Tensor] | None = None, *,
          pairs: Mapping[str, Any] | None = None,
          generator: torch.Generator | None = None) -> LayerPlan:
    """Give ``layer`` (a path, or an entry of :func:`plan_widening`'s plan) k more neurons
    and its consumers k zero input columns, leaving the model's output unchanged.

    ``init``: the new incoming weights, [k, *weight.shape[1:]] (or [k, in] flattened; for
    Llama's gate and up projections, a mapping from path to tensor; for a fused gate-and-up
    layer, [2k, in]: the k rows of its first half, Phi-3's gate, then the k of its second);
    random when omitted.
    Raises :class:`PerforationError` (before anything changes) when the layer cannot be
    widened, saying why (also for a ``k`` that is not a multiple of the group size of a
    GroupNorm on the way). Returns the plan entry that was applied."""
    inner = unwrap_model(model)
    if isinstance(layer, int) and not isinstance(layer, bool):
        layer = str(layer)  # an index into an nn.Sequential is its path
    if not isinstance(layer, (str, LayerPlan)):
        raise PerforationError(f"widen() takes a layer's path (e.g. 'encoder.0') or an entry "
                               f"of plan_widening(model).layers, got {layer!r}")
    if isinstance(layer, str):
        plan = plan_widening(inner, pairs=pairs)
        if layer not in plan.layers:
            raise PerforationError(_not_a_producer(inner, layer, plan.layers))
        entry = plan.layers[layer]
    else:
        entry = layer
    if not entry.widenable:
        raise PerforationError(f"widen(): {entry.path!r} cannot be widened: {entry.reason}")
    k = _neuron_count(k)
    multiple = neuron_multiple(inner, entry)
    if k % multiple:
        raise PerforationError(f"widen(): {entry.path!r} gains neurons in multiples of "
                               f"{multiple} (a GroupNorm it feeds normalises groups of that "
                               f"many channels), not {k}")
    producers, rows = [entry.path, *entry.partners], k * entry.chunks
    inits = _split_init(init, producers)
    for path in producers:  # check every shape before changing anything
        _check_init(inner.get_submodule(path), inits[path], rows, path)
    width = sum(_blocks_of(_core(inner.get_submodule(entry.path)))[0]) // entry.chunks
    for path in producers:
        widen_producer(inner.get_submodule(path), rows, inits[path], generator)
        if entry.chunks > 1:  # its output is put in the order the block reads (chunked.py)
            _core(inner.get_submodule(path)).out_chunks = entry.chunks
    for path, repeat in entry.consumers:
        widen_consumer(inner.get_submodule(path), k * repeat)
    for path, axis in entry.through:
        _widen_through(inner, path, axis, k, width, generator)
    record = getattr(inner.get_submodule(entry.path), "widenings", None)
    event = {"k": k, **{key: value for key, value in asdict(entry).items()
                        if key in ("consumers", "through", "partners")},
             **({"chunks": entry.chunks} if entry.chunks > 1 else {})}
    target = inner.get_submodule(entry.path)
    target.widenings = [*(record or []), _jsonable(event)]
    if entry.chunks > 1:
        note_fused_widenings(inner)
    return entry


def _not_a_producer(root: nn.Module, path: str, known: Mapping[str, Any]) -> str:
    """Why ``path`` is not a layer ``widen`` can give neurons."""
    try:
        module = root.get_submodule(path)
    except AttributeError:
        module = None
    if module is not None and is_grouped_conv(module):
        return (f"widen(): {path!r} is a grouped convolution, which cannot gain neurons of its "
                "own; a depthwise conv gains channels with the layer that feeds it: widen that "
                "one")
    return (f"widen(): {path!r} is not a Linear, Conv or Conv1D layer of this model; layers: "
            f"{sorted(known)[:8]}")


def _jsonable(event: dict) -> dict:
    return {key: [list(v) if isinstance(v, tuple) else v for v in value]
            if isinstance(value, list) else value for key, value in event.items()}


def _split_init(init: Any, producers: list[str]) -> dict[str, torch.Tensor | None]:
    if init is None or isinstance(init, torch.Tensor):
        return {p: init if i == 0 else None for i, p in enumerate(producers)}
    unknown = sorted(set(init) - set(producers))
    if unknown:
        raise PerforationError(f"widen(init=...): {unknown} are not among the widened "
                               f"producers {producers}")
    return {p: init.get(p) for p in producers}


def _core(module: nn.Module) -> nn.Module:
    """The Linear/Conv/Conv1D whose weight a widening changes."""
    return module.source if isinstance(module, DendriticLayer) else module


def out_dim(core: nn.Module) -> int:
    return 1 if is_hf_conv1d(core) else 0


def _check_init(module: nn.Module, init: torch.Tensor | None, k: int, path: str) -> None:
    core = _core(module)
    if not (isinstance(core, (nn.Linear, *CONV_TYPES)) or is_hf_conv1d(core)):
        raise PerforationError(f"{path}: a {type(core).__name__} cannot be widened")
    if getattr(core, "groups", 1) != 1:
        raise PerforationError(f"{path}: a grouped conv (groups={core.groups}) cannot be "
                               "widened")
    if init is None:
        return
    w = core.weight
    row = (w.shape[0],) if is_hf_conv1d(core) else tuple(w.shape[1:])
    if tuple(init.shape) not in ((k, *row), (k, math.prod(row))):
        raise PerforationError(f"{path}: init must have shape {(k, *row)} (or "
                               f"{(k, math.prod(row))}), got {tuple(init.shape)}")


def _fresh_rows(core: nn.Module, k: int, init: torch.Tensor | None,
                generator: torch.Generator | None) -> torch.Tensor:
    """k new incoming weight rows in the weight's own layout (Conv1D: columns)."""
    w = core.weight
    if is_hf_conv1d(core):
        rows = init if init is not None else torch.randn(k, w.shape[0], generator=generator) * 0.02
        return rows.reshape(k, w.shape[0]).T.to(w)
    shape = (k, *w.shape[1:])
    if init is not None:
        return init.reshape(shape).to(w)
    bound = 1.0 / math.sqrt(max(math.prod(w.shape[1:]), 1))  # kaiming_uniform(a=sqrt(5))
    return ((torch.rand(shape, generator=generator) * 2 - 1) * bound).to(w)


def _grow_param(owner: nn.Module, name: str, extra: torch.Tensor, dim: int) -> None:
    """``extra`` appended to parameter ``name`` along ``dim``, in the old tensor's memory
    layout (a channels_last weight stays so: the blocks' calls then match the narrow one's)."""
    old = getattr(owner, name)
    data = same_layout(torch.cat([old.detach(), extra.to(old)], dim), old)
    setattr(owner, name, nn.Parameter(data, requires_grad=old.requires_grad))


def _neuron_count(k: Any) -> int:
    """``k`` as a whole number of neurons (an int or integer tensor; not a bool, a float or
    a string, which ``int()`` would silently round or parse); PerforationError otherwise."""
    if isinstance(k, torch.Tensor) and k.numel() == 1 and not k.is_floating_point() \
            and k.dtype != torch.bool:
        k = int(k.item())
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise PerforationError(f"widen(): k must be a whole number of neurons, got {k!r}")
    if k < 1:
        raise PerforationError(f"widen(): k must be at least 1, got {k}")
    return int(k)


def widen_producer(module: nn.Module, k: int, init: torch.Tensor | None = None,
                   generator: torch.Generator | None = None) -> None:
    """k more output neurons on a Linear/Conv/Conv1D or a DendriticLayer over one."""
    core = _core(module)
    outs, ins = _blocks_of(core)
    od = out_dim(core)
    with torch.no_grad():
        _grow_param(core, "weight", _fresh_rows(core, k, init, generator), od)
        if core.bias is not None:
            _grow_param(core, "bias", torch.zeros(k), 0)
    for attr in ("out_features", "out_channels", "nf"):
        if hasattr(core, attr):
            setattr(core, attr, getattr(core, attr) + k)
    make_blocked(core)
    core.out_blocks, core.in_blocks = [*outs, k], ins
    if isinstance(module, DendriticLayer):
        if module.grouped:
            widen_norm(module.base[1], k, "its norm")
        _widen_dendritic_producer(module, k, generator)


def _blocks_of(core: nn.Module) -> tuple[list[int], list[int]]:
    if hasattr(core, "blocks") and callable(core.blocks):
        return core.blocks()
    w = core.weight
    o, i = (1, 0) if is_hf_conv1d(core) or isinstance(core, TRANSPOSED_CONVS) else (0, 1)
    return [w.shape[o]], [w.shape[i]]


def _widen_dendritic_producer(layer: DendriticLayer, k: int,
                              generator: torch.Generator | None) -> None:
    """New neurons on a dendritic layer: full sets gain random bank rows, chosen-neuron sets
    do not feed them; ``v`` and the cascade gain zero columns (the output is unchanged)."""
    n, kd = change_neuron_count(layer, k)
    if kd == 0:
        return
    with torch.no_grad():
        if layer.kind == "generic":  # GPT-2's Conv1D: a bank per parameter
            grow_generic_outputs(layer, [_fresh_rows(layer.source, k, None, generator)
                                         for _ in range(kd)])
        elif layer.dendrite_mask is None:
            rows = [_fresh_rows(layer.source, k, None, generator) for _ in range(kd)]
            w = layer.bank_weight.detach().split(n)
            layer.bank_weight = layer._new_param(
                torch.cat([t for pair in zip(w, rows, strict=True) for t in pair]), "bank")
            if layer.bank_bias is not None:
                b = layer.bank_bias.detach().split(n)
                layer.bank_bias = layer._new_param(torch.cat(
                    [t for part in b for t in (part, part.new_zeros(k))]), "bank")
        else:
            mask = layer.dendrite_mask
            layer.dendrite_mask = torch.cat([mask, mask.new_zeros(kd, k)], 1)
        _zero_columns(layer, k)


def _zero_columns(layer: DendriticLayer, k: int) -> None:
    """``v`` and the cascade gain k zero columns: the new neurons take no dendrite's output."""
    layer.out_weight = layer._new_param(torch.cat(
        [layer.out_weight.detach(), layer.out_weight.new_zeros(layer.out_weight.shape[0], k)],
        1), "out")
    if layer.cascade is not None:
        layer.cascade = layer._new_param(torch.cat(
            [layer.cascade.detach(), layer.cascade.new_zeros(layer.cascade.shape[0], k)],
            1), "cascade")


def _widen_depthwise(module: nn.Module, k: int, generator: torch.Generator | None) -> None:
    """k more channels on a depthwise conv between producer and reader: random filters (the
    conv's own init scale), zero biases, computed block by block. A dendritic one's sets gain
    random rows for them (its bank is laid out group by group) and zero ``v`` columns."""
    core = _core(module)
    outs, _ = _blocks_of(core)
    with torch.no_grad():
        _grow_param(core, "weight", _fresh_rows(core, k, None, generator), 0)
        if core.bias is not None:
            _grow_param(core, "bias", torch.zeros(k), 0)
    for attr in ("in_channels", "out_channels", "groups"):
        setattr(core, attr, getattr(core, attr) + k)
    make_blocked(core)
    core.out_blocks = [*outs, k]
    if not isinstance(module, DendriticLayer):
        return
    if module.grouped:
        widen_norm(module.base[1], k, "its norm")
    n, kd = change_neuron_count(module, k)
    if kd == 0:
        return
    with torch.no_grad():
        bank = module.bank_weight.detach().unflatten(0, (n, kd, 1))  # [groups, sets, 1, ...]
        fresh = _fresh_rows(core, k * kd, None, generator).reshape(k, *bank.shape[1:])
        module.bank_weight = module._new_param(torch.cat([bank, fresh]).flatten(0, 2), "bank")
        if module.bank_bias is not None:
            bias = module.bank_bias.detach().unflatten(0, (n, kd, 1))
            module.bank_bias = module._new_param(
                torch.cat([bias, bias.new_zeros(k, kd, 1)]).flatten(0, 2), "bank")
        _zero_columns(module, k)


def widen_consumer(module: nn.Module, extra: int) -> None:
    """``extra`` zero input columns, appended, on a Linear/Conv/Conv1D/ConvTranspose or a
    DendriticLayer over one (in its base and in its dendrite bank)."""
    core = _core(module)
    outs, ins = _blocks_of(core)
    in_dim = 0 if is_hf_conv1d(core) or isinstance(core, TRANSPOSED_CONVS) else 1
    w = core.weight
    shape = list(w.shape)
    shape[in_dim] = extra
    with torch.no_grad():
        _grow_param(core, "weight", w.new_zeros(shape), in_dim)
        if isinstance(module, DendriticLayer):
            if module.has_candidate:
                module.merge_candidate()
            if module.kind == "generic" and module.num_dendrites:
                grow_generic_inputs(module, extra)
            elif getattr(module, "bank_weight", None) is not None:
                bank = module.bank_weight
                pad = list(bank.shape)
                pad[1] = extra
                module.bank_weight = module._new_param(
                    torch.cat([bank.detach(), bank.new_zeros(pad)], 1), "bank")
    for attr in ("in_features", "in_channels"):
        if hasattr(core, attr):
            setattr(core, attr, getattr(core, attr) + extra)
    make_blocked(core)
    core.out_blocks, core.in_blocks = outs, [*ins, extra]


def _widen_through(root: nn.Module, path: str, axis: int, k: int, width: int,
                   generator: torch.Generator | None = None) -> None:
    """A module or function between producer and consumer: a channel norm gains channels, a
    depthwise conv gains channels of its own, relu (exact whatever the width) stays, anything
    else is applied block by block."""
    parent_path, _, attr = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    target = getattr(parent, attr)
    if isinstance(target, CHANNEL_NORMS):
        widen_norm(target, k, path)
        return
    if is_grouped_conv(target):
        _widen_depthwise(target, k, generator)
        return
    if isinstance(target, Blockwise):
        target.out_blocks = [*target.out_blocks, k]
        return
    if is_width_exact(target):
        return  # exact on any width: left as it is (and so free to be shared)
    raise_if_stateful(target, path)
    wrapped = Blockwise(target, axis, [width, k])
    wrapped.train(target.training if isinstance(target, nn.Module) else parent.training)
    if attr in parent._modules:
        parent._modules[attr] = wrapped  # in place: a Sequential keeps its order
    else:
        setattr(parent, attr, wrapped)  # a function attribute (an activation)
    if isinstance(parent, nn.TransformerEncoderLayer | nn.TransformerDecoderLayer):
        parent.activation_relu_or_gelu = 0  # its fused fast path would skip the blocks


def raise_if_stateful(target: Any, path: str) -> None:
    if isinstance(target, nn.Module) and (any(True for _ in target.parameters())
                                          or any(True for _ in target.buffers())):
        raise PerforationError(f"{path}: a {type(target).__name__} with parameters or "
                               "buffers cannot be passed through by a widening")


def replay_widenings(model: nn.Module, path: str, events: list[dict],
                     generator: torch.Generator | None = None) -> None:
    """Apply recorded widenings (``layer.widenings`` of a saved model) to ``model``'s layer
    at ``path``, so its shapes match the saved ones (the values are loaded afterwards).
    Widenings already applied here are skipped; a model widened further than the record (a
    rewind to a narrower best model) gives back its newer neurons; a model widened otherwise
    is refused."""
    layer = model.get_submodule(path)
    done = list(getattr(layer, "widenings", None) or [])
    if len(done) > len(events) and done[:len(events)] == events:
        narrow_widenings(model, path, len(events))
        return
    if done != events[:len(done)]:
        raise PerforationError(f"layer {path!r} was widened differently here ({done}) than "
                               f"in the checkpoint ({events}); load into a freshly built "
                               "model")
    for event in events[len(done):]:
        entry = LayerPlan(path=path, widenable=True,
                          consumers=[tuple(c) for c in event["consumers"]],
                          through=[tuple(t) for t in event["through"]],
                          partners=list(event.get("partners", [])),
                          chunks=int(event.get("chunks", 1)))
        widen(model, entry, event["k"], generator=generator)
