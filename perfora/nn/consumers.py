"""Which layers can gain neurons, and what reads their outputs: :func:`plan_widening`.

A layer can gain neurons only when every reader of its outputs is known and can gain zeroed
input columns. The readers are found, in this order:

1. ``pairs=``: an explicit mapping, for any model (``{"block.fc1": ["block.fc2"]}``; a
   consumer after a flatten as ``("head", repeat)``; a BatchNorm or a stateless module on the
   way listed among the consumers is widened or applied block by block);
2. the known Transformer feed-forward pairs: ``nn.TransformerEncoderLayer``/``DecoderLayer``
   (``linear1`` -> ``linear2``), BERT (``intermediate.dense`` -> ``output.dense``), GPT-2
   (``mlp.c_fc`` -> ``mlp.c_proj``, Hugging Face ``Conv1D``) and Llama (``gate_proj`` and
   ``up_proj`` together -> ``down_proj``); only the hidden width grows, never ``d_model``;
3. ``nn.Sequential`` chains through activations, dropout, pooling, BatchNorm and ``Flatten``;
4. ``torch.fx`` symbolic tracing, where the model traces.

A layer whose output is normalised jointly (LayerNorm, GroupNorm), added to a residual
stream, split into attention heads, or read by something unknown is refused, with the reason.
"""

from __future__ import annotations

import difflib
import operator
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PerforationError
from .blocks import (
    BN_TYPES,
    CONV_TYPES,
    BlockedBatchNorm,
    BlockedLayer,
    Blockwise,
    is_hf_conv1d,
)
from .layers import DendriticLayer

ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.Tanh,
               nn.Sigmoid, nn.SiLU, nn.Mish, nn.Softplus, nn.Hardtanh, nn.Hardswish,
               nn.Hardsigmoid, nn.Tanhshrink, nn.Softsign, nn.Identity, Blockwise)
DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
POOLING = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
           nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
           nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)
JOINT_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.LocalResponseNorm)
_ATTENTION_NAMES = {"q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "query", "key",
                    "value", "c_attn", "qkv", "in_proj", "q", "k", "v"}
_RESIDUAL = "its output is added into the residual stream (d_model), which many layers read"
# functions that compute each element the same way whatever the tensor's width
_EXACT_FUNCTIONS = {F.relu, torch.relu, F.relu6, F.hardtanh, F.max_pool1d, F.max_pool2d,
                    F.max_pool3d}
_EXACT_METHODS = {"relu", "relu_"}
_ADDS = {operator.add, operator.iadd, torch.add, operator.sub, torch.sub}


@dataclass
class LayerPlan:
    """One layer: can it gain neurons, and if so what changes with it.

    ``consumers``: (path, repeat) of each layer that gains ``k * repeat`` zero input columns
    (repeat is the spatial size after a Flatten, else 1); ``through``: (path, axis) of each
    BatchNorm (gains channels) or stateless module/function (applied block by block) between
    them; ``partners``: layers widened together with this one (Llama's gate and up)."""

    path: str
    widenable: bool
    reason: str | None = None
    consumers: list[tuple[str, int]] = field(default_factory=list)
    through: list[tuple[str, int]] = field(default_factory=list)
    partners: list[str] = field(default_factory=list)
    found_by: str = ""


@dataclass
class WideningPlan:
    """Per layer (by path), whether it can gain neurons: its consumers, or why not."""

    layers: dict[str, LayerPlan] = field(default_factory=dict)

    @property
    def widenable(self) -> list[str]:
        return [p for p, e in self.layers.items() if e.widenable]

    @property
    def refused(self) -> dict[str, str]:
        return {p: e.reason or "" for p, e in self.layers.items() if not e.widenable}

    def __str__(self) -> str:
        lines = [f"{len(self.widenable)} of {len(self.layers)} layer(s) can gain neurons:"]
        for path, e in self.layers.items():
            if e.widenable:
                reads = ", ".join(p if r == 1 else f"{p} (x{r})" for p, r in e.consumers)
                extra = f" with {', '.join(e.partners)}" if e.partners else ""
                lines.append(f"  {path}{extra} -> {reads}  [{e.found_by}]")
            else:
                lines.append(f"  {path}: refused: {e.reason}")
        return "\n".join(lines)


def is_producer(module: nn.Module) -> bool:
    """A layer that can gain output neurons: Linear, Conv (groups=1), HF Conv1D, or a
    Linear/Conv dendritic layer."""
    if isinstance(module, DendriticLayer):
        if module.kind == "generic":  # e.g. GPT-2's Conv1D: widenable while it has no sets
            return module.num_dendrites == 0 and (isinstance(module.source, nn.Linear)
                                                  or is_hf_conv1d(module.source))
        return module.kind in ("linear", "conv") and module._groups() == 1
    if isinstance(module, CONV_TYPES):
        return module.groups == 1
    return isinstance(module, nn.Linear) or is_hf_conv1d(module)


def _width(module: nn.Module, side: str) -> int:
    core = module.source if isinstance(module, DendriticLayer) else module
    w = core.weight
    if is_hf_conv1d(core):
        return int(w.shape[1] if side == "out" else w.shape[0])
    return int(w.shape[0] if side == "out" else w.shape[1])


def _axis(module: nn.Module) -> int:
    core = module.source if isinstance(module, DendriticLayer) else module
    # a conv's channel axis counted from the end: the same for batched and unbatched inputs
    return 1 - core.weight.dim() if isinstance(core, CONV_TYPES) else -1


def plan_widening(model: nn.Module, pairs: Mapping[str, Any] | None = None, *,
                  trace: bool = True) -> WideningPlan:
    """For every Linear/Conv/Conv1D layer (or dendritic layer over one) of ``model``: the
    consumers and pass-through modules a widening changes, or why it is refused.

    ``pairs``: ``{producer: [consumer, ...]}`` for layers the search cannot follow (a consumer
    after a flatten as ``(path, repeat)``). ``trace``: also try ``torch.fx``."""
    if not isinstance(model, nn.Module):
        raise PerforationError(f"plan_widening() takes an nn.Module, got {type(model).__name__}")
    candidates = _candidates(model)
    plan = WideningPlan({p: LayerPlan(p, False, "its consumers are unknown: it is not in an "
                                      "nn.Sequential chain or a known Transformer block; "
                                      "pass pairs={path: [consumers]}")
                         for p in candidates})
    decided: set[str] = set()
    for path, readers in (pairs or {}).items():
        plan.layers[path] = _explicit(model, path, readers)
        decided.add(path)
    for entry in _known_blocks(model):
        if entry.path in plan.layers and entry.path not in decided:
            plan.layers[entry.path] = entry
            decided.add(entry.path)
    for entry in _sequential_chains(model):
        if entry.path in plan.layers and entry.path not in decided:
            plan.layers[entry.path] = entry
            decided.add(entry.path)
    if trace and set(candidates) - decided:
        for entry in _traced(model, set(candidates) - decided):
            plan.layers[entry.path] = entry
    _refuse_shared(model, plan)
    return plan


def _module_at(model: nn.Module, path: str) -> Any:
    """The module (or function attribute, e.g. a Transformer block's activation) at ``path``."""
    parent, _, attr = path.rpartition(".")
    return getattr(model.get_submodule(parent) if parent else model, attr, None)


def _refuse_shared(model: nn.Module, plan: WideningPlan) -> None:
    """Refuse a widening that changes a module reachable at two paths of the model (one
    object used twice): its other use would see the new neurons' columns or rows too."""
    paths: dict[int, list[str]] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(path)
    for path, entry in plan.layers.items():
        if not entry.widenable:
            continue
        changed = [path, *entry.partners, *(p for p, _ in entry.consumers),
                   *(p for p, _ in entry.through)]
        for name in changed:
            module = _module_at(model, name)
            if not isinstance(module, nn.Module) or isinstance(module, ELEMENTWISE):
                continue  # a function, or an activation whose blockwise form any input passes
            others = [p for p in paths.get(id(module), []) if p != name]
            if others:
                plan.layers[path] = _refuse(path, f"{name} is the same module as {others[0]} "
                                                  "(used twice): its other use would change "
                                                  "too", entry.found_by)
                break


def _candidates(model: nn.Module) -> list[str]:
    inside: list[str] = []
    out = []
    for path, module in model.named_modules():
        if any(path.startswith(p + ".") for p in inside):
            continue
        if isinstance(module, DendriticLayer):
            inside.append(path)
        if path and (is_producer(module) or isinstance(module, (nn.Linear, *CONV_TYPES))):
            out.append(path)
    return out


def _refuse(path: str, reason: str, found_by: str) -> LayerPlan:
    return LayerPlan(path, False, reason, found_by=found_by)


def _nearest_path(model: nn.Module, path: str) -> str:
    """'; did you mean ...?' with the model's closest module paths (paths are the unwrapped
    model's: no DDP 'module.' prefix), or ''."""
    paths = [p for p, _ in model.named_modules() if p]
    close = difflib.get_close_matches(path, paths, n=3, cutoff=0.5)
    if not close and "." in path:  # e.g. 'module.fc1' under DDP: the last parts may match
        close = [p for p in paths if path.endswith("." + p)][:3]
    return f"; did you mean {' or '.join(repr(p) for p in close)}?" if close else ""


def _explicit(model: nn.Module, path: str, readers: Any) -> LayerPlan:
    """A ``pairs=`` entry, checked against the modules it names."""
    try:
        producer = model.get_submodule(path)
    except AttributeError as exc:
        raise PerforationError(f"pairs: {path!r} is not a submodule of this model"
                               f"{_nearest_path(model, path)}") from exc
    if not is_producer(producer):
        return _refuse(path, f"a {type(producer).__name__} cannot gain neurons", "pairs")
    if isinstance(readers, str):
        readers = [readers]
    entry = LayerPlan(path, True, found_by="pairs")
    width, axis = _width(producer, "out"), _axis(producer)
    targets = [item if isinstance(item, str) else item[0] for item in readers]
    if path in targets:
        raise PerforationError(f"pairs[{path!r}]: a layer cannot read its own outputs; list "
                               "the modules its outputs go to")
    twice = sorted({t for t in targets if targets.count(t) > 1})
    if twice:
        raise PerforationError(f"pairs[{path!r}]: {twice[0]!r} is listed twice; list each "
                               "reader once")
    for item in readers:
        target, repeat = (item, 1) if isinstance(item, str) else (item[0], int(item[1]))
        try:
            module = model.get_submodule(target)
        except AttributeError as exc:
            raise PerforationError(f"pairs[{path!r}]: {target!r} is not a submodule of this "
                                   f"model{_nearest_path(model, target)}") from exc
        if isinstance(module, BN_TYPES):
            if module.num_features != width:
                return _refuse(path, f"pairs: {target!r} normalises {module.num_features} "
                                     f"channels, not the {width} {path!r} gives", "pairs")
            entry.through.append((target, 1))
        elif is_producer(module):
            have = _width(module, "in")
            if have != width * repeat:
                return _refuse(path, f"pairs: {target!r} reads {have} inputs, not "
                                     f"{width} x {repeat}", "pairs")
            entry.consumers.append((target, repeat))
        elif isinstance(module, JOINT_NORMS):
            return _refuse(path, f"its outputs are normalised jointly by {target!r} "
                                 f"({type(module).__name__})", "pairs")
        elif not any(True for _ in module.parameters()) and not any(True for _ in
                                                                      module.buffers()):
            entry.through.append((target, axis))
        else:
            return _refuse(path, f"pairs: {target!r} ({type(module).__name__}) is neither a "
                                 "Linear/Conv consumer, a BatchNorm nor stateless", "pairs")
    if not entry.consumers:
        return _refuse(path, "pairs: no Linear/Conv consumer listed", "pairs")
    return entry


def _known_blocks(model: nn.Module) -> list[LayerPlan]:
    """The Transformer feed-forward pairs, and refusals for the rest of those blocks."""
    out: list[LayerPlan] = []
    for path, m in model.named_modules():
        pre = f"{path}." if path else ""

        def has(*names: str, _m=m) -> bool:
            return all(_has_path(_m, n) for n in names)

        if isinstance(m, nn.TransformerEncoderLayer | nn.TransformerDecoderLayer):
            out.append(LayerPlan(pre + "linear1", True, consumers=[(pre + "linear2", 1)],
                                 through=[(pre + "activation", -1), (pre + "dropout", -1)],
                                 found_by="nn.Transformer block"))
            out.append(_refuse(pre + "linear2", _RESIDUAL, "nn.Transformer block"))
        elif has("intermediate.dense", "intermediate.intermediate_act_fn", "output.dense"):
            out.append(LayerPlan(pre + "intermediate.dense", True,
                                 consumers=[(pre + "output.dense", 1)],
                                 through=[(pre + "intermediate.intermediate_act_fn", -1)],
                                 found_by="BERT block"))
            out.append(_refuse(pre + "output.dense", _RESIDUAL + " (then LayerNorm)",
                               "BERT block"))
        elif has("c_fc", "c_proj", "act") and is_hf_conv1d(
                m.c_fc.source if isinstance(m.c_fc, DendriticLayer) else m.c_fc):
            out.append(LayerPlan(pre + "c_fc", True, consumers=[(pre + "c_proj", 1)],
                                 through=[(pre + "act", -1)], found_by="GPT-2 MLP"))
            out.append(_refuse(pre + "c_proj", _RESIDUAL, "GPT-2 MLP"))
        elif type(m).__name__.endswith("DenseGatedActDense") and \
                has("wi_0", "wi_1", "wo", "act"):  # T5 v1.1, mT5, UMT5: act(wi_0) * wi_1
            for name, other in (("wi_0", "wi_1"), ("wi_1", "wi_0")):
                out.append(LayerPlan(pre + name, True, consumers=[(pre + "wo", 1)],
                                     through=_present(m, pre, "act", "dropout"),
                                     partners=[pre + other], found_by="T5 feed-forward"))
            out.append(_refuse(pre + "wo", _RESIDUAL, "T5 feed-forward"))
        elif type(m).__name__.endswith("DenseActDense") and has("wi", "wo", "act"):  # T5
            out.append(LayerPlan(pre + "wi", True, consumers=[(pre + "wo", 1)],
                                 through=_present(m, pre, "act", "dropout"),
                                 found_by="T5 feed-forward"))
            out.append(_refuse(pre + "wo", _RESIDUAL, "T5 feed-forward"))
        elif type(m).__name__.endswith("MLP") and has("fc1", "fc2", "activation_fn") \
                and not has("gate_proj"):  # ViT (transformers 5), CLIP, SigLIP: fc1 -> act -> fc2
            out.append(LayerPlan(pre + "fc1", True, consumers=[(pre + "fc2", 1)],
                                 through=[(pre + "activation_fn", -1)], found_by="ViT/CLIP MLP"))
            out.append(_refuse(pre + "fc2", _RESIDUAL, "ViT/CLIP MLP"))
        elif has("gate_proj", "up_proj", "down_proj", "act_fn"):
            for name, other in (("gate_proj", "up_proj"), ("up_proj", "gate_proj")):
                out.append(LayerPlan(pre + name, True, consumers=[(pre + "down_proj", 1)],
                                     through=[(pre + "act_fn", -1)], partners=[pre + other],
                                     found_by="Llama MLP"))
            out.append(_refuse(pre + "down_proj", _RESIDUAL, "Llama MLP"))
        else:
            for name, child in m.named_children():
                attention = "attention" in type(m).__name__.lower()
                if (name in _ATTENTION_NAMES or attention) and is_producer(child) or \
                        isinstance(m, nn.MultiheadAttention) and name == "out_proj":
                    out.append(_refuse(pre + name, "an attention projection: its outputs are "
                                       "split into heads or added to the residual stream",
                                       "attention"))
    return out


def _present(block: nn.Module, pre: str, *names: str) -> list[tuple[str, int]]:
    """(path, feature axis -1) for each of ``names`` the block has: the modules between a
    feed-forward pair's layers, each applied block by block once widened."""
    return [(pre + name, -1) for name in names if hasattr(block, name)]


def _has_path(module: nn.Module, dotted: str) -> bool:
    for name in dotted.split("."):
        if not hasattr(module, name):
            return False
        module = getattr(module, name)
    return True


def _sequential_chains(model: nn.Module) -> list[LayerPlan]:
    out = []
    for path, seq in model.named_modules():
        if not isinstance(seq, nn.Sequential):
            continue
        pre = f"{path}." if path else ""
        children = list(seq.named_children())
        for i, (name, child) in enumerate(children):
            if is_producer(child):
                out.append(_follow(pre, name, child, children[i + 1:], path))
    return out


def _follow(pre: str, name: str, producer: nn.Module,
            rest: Sequence[tuple[str, nn.Module]], seq_path: str) -> LayerPlan:
    """Walk a Sequential from a producer to its consumer."""
    path, by = pre + name, "nn.Sequential"
    width, axis = _width(producer, "out"), _axis(producer)
    entry = LayerPlan(path, True, found_by=by)
    flat = False
    for child_name, child in rest:
        cpath = pre + child_name
        if isinstance(child, (*ELEMENTWISE, *DROPOUT, *POOLING)):
            if not isinstance(child, nn.Identity):
                entry.through.append((cpath, axis))
        elif isinstance(child, BN_TYPES):
            if child.num_features != width:
                return _refuse(path, f"{cpath} normalises {child.num_features} features, not "
                                     f"its {width}", by)
            entry.through.append((cpath, 1))
        elif isinstance(child, nn.Flatten):
            if child.start_dim != 1 or child.end_dim != -1:
                return _refuse(path, f"{cpath} flattens dims {child.start_dim}..{child.end_dim}"
                                     "; only Flatten(1, -1) is followed", by)
            flat = True
        elif is_producer(child):
            have = _width(child, "in")
            if have % width or (not flat and have != width):
                return _refuse(path, f"{cpath} reads {have} inputs, not a multiple of its "
                                     f"{width} outputs", by)
            entry.consumers.append((cpath, have // width))
            return entry
        elif isinstance(child, JOINT_NORMS):
            return _refuse(path, f"its outputs are normalised jointly by {cpath} "
                                 f"({type(child).__name__})", by)
        else:
            return _refuse(path, f"its output goes to {cpath} ({type(child).__name__}), whose "
                                 "use of new neurons is unknown; pass pairs=", by)
    return _refuse(path, f"its output leaves the nn.Sequential {seq_path or '(model)'}, so its "
                         "consumer is unknown; pass pairs=", by)


class _LeafTracer(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        # perfora's own modules, and the widened (blocked) forms of torch's, are leaves as
        # the torch modules they stand for are: followed by type, never traced into
        return isinstance(m, DendriticLayer | Blockwise | BlockedLayer | BlockedBatchNorm) \
            or is_hf_conv1d(m) or super().is_leaf_module(m, qualname)


def _traced(model: nn.Module, wanted: set[str]) -> list[LayerPlan]:
    """Follow each wanted producer's output through a torch.fx graph of the model."""
    try:
        graph = _LeafTracer().trace(model)
    except Exception as exc:  # noqa: BLE001 - any trace failure means: fx cannot tell
        reason = (f"not in an nn.Sequential chain or a known block, and torch.fx cannot trace "
                  f"the model ({type(exc).__name__}); pass pairs=")
        return [_refuse(p, reason, "torch.fx") for p in sorted(wanted)]
    calls = Counter(str(node.target) for node in graph.nodes if node.op == "call_module")
    out, done = [], set()
    for node in graph.nodes:
        target = str(node.target)
        if node.op != "call_module" or target not in wanted or target in done:
            continue
        done.add(target)
        if calls[target] > 1:
            out.append(_refuse(target, f"it is called {calls[target]} times (its weights are "
                                       "shared by those calls), so its readers cannot be "
                                       "widened apart; pass pairs= if they can", "torch.fx"))
            continue
        entry = _follow_graph(model, node)
        # a shared activation is fine: its blockwise form passes other calls' inputs through
        shared = [p for p, _ in [*entry.consumers, *entry.through] if calls[p] > 1
                  and not isinstance(_module_at(model, p), ELEMENTWISE)]
        if entry.widenable and shared:
            entry = _refuse(target, f"its output goes to {shared[0]}, which is called "
                                    f"{calls[shared[0]]} times: its other calls' inputs would "
                                    "not widen", "torch.fx")
        out.append(entry)
    return out


def _follow_graph(model: nn.Module, start: torch.fx.Node) -> LayerPlan:
    path, by = str(start.target), "torch.fx"
    producer = model.get_submodule(path)
    width, axis = _width(producer, "out"), _axis(producer)
    entry = LayerPlan(path, True, found_by=by)
    todo = [(user, False) for user in start.users]
    seen: set[str] = set()
    while todo:
        node, flat = todo.pop()
        if node.name in seen:
            continue
        seen.add(node.name)
        nxt = [(user, flat) for user in node.users]
        if node.op == "call_module":
            module = model.get_submodule(str(node.target))
            target = str(node.target)
            if is_producer(module):
                have = _width(module, "in")
                if have % width or (not flat and have != width):
                    return _refuse(path, f"{target} reads {have} inputs, not a multiple of "
                                         f"its {width} outputs", by)
                entry.consumers.append((target, have // width))
                continue
            if isinstance(module, BN_TYPES):
                entry.through.append((target, 1))
            elif isinstance(module, (*ELEMENTWISE, *DROPOUT, *POOLING)):
                if not isinstance(module, nn.Identity):
                    entry.through.append((target, axis))
            elif isinstance(module, nn.Flatten) and module.start_dim == 1 \
                    and module.end_dim == -1:
                nxt = [(user, True) for user in node.users]
            elif isinstance(module, JOINT_NORMS):
                return _refuse(path, f"its outputs are normalised jointly by {target} "
                                     f"({type(module).__name__})", by)
            else:
                return _refuse(path, f"its output goes to {target} ({type(module).__name__}), "
                                     "whose use of new neurons is unknown; pass pairs=", by)
        elif node.op == "call_function" and node.target in _ADDS:
            return _refuse(path, f"its output is added to another tensor ({node.name}): a "
                                 "residual connection", by)
        elif node.op == "call_function" and node.target is torch.flatten and \
                tuple(node.args[1:]) in ((1,), ()) and node.kwargs.get("start_dim", 1) == 1:
            nxt = [(user, True) for user in node.users]
        elif not (node.op == "call_function" and node.target in _EXACT_FUNCTIONS
                  or node.op == "call_method" and node.target in _EXACT_METHODS):
            what = "an output of the model" if node.op == "output" else \
                f"{getattr(node.target, '__name__', node.target)} ({node.op})"
            return _refuse(path, f"its output goes to {what}, which a widening cannot follow "
                                 "(elementwise modules and relu are followed); pass pairs=", by)
        todo.extend(nxt)
    if not entry.consumers:
        return _refuse(path, "no Linear/Conv consumer reads its output", by)
    return entry
