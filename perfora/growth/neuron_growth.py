"""A neuron growth step: every wrapped layer that can gain neurons gains them, exactly.

The controller calls :func:`grow_neurons` at a plateau when ``growth='neurons'`` (or when
``growth='auto'`` chose neurons). Each
wrapped layer whose readers :func:`perfora.plan_widening` finds gains
``neurons_per_step`` times its starting width in new neurons (at least one); its readers gain
zero input columns, so the model's output is unchanged. The new incoming weights come from
the recorded error signal (GradMax, ``neuron_init='gradmax'``) where one was recorded for the
layer, else from the layer's own initialisation drawn from a generator seeded per step and
layer, so every rank grows the same neurons. Layers are widened from the last to the first, so
a layer's GradMax rows (computed for its input width before the step) still fit.
"""

from __future__ import annotations

import contextlib
import re
import warnings
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import PerforaConfig
from ..errors import PerforationError
from ..nn.blocks import is_hf_conv1d
from ..nn.consumers import LayerPlan, WideningPlan, plan_widening
from ..nn.layers import DendriticLayer, dendritic_layers, unwrap_model
from ..nn.norm_widening import neuron_multiple
from ..nn.widening import gradmax_rows, widen
from ..parallel.base import PairScope, ParallelBackend
from .state import ControllerState
from .surgery import record_growth
from .widening_signal import WideningSignal, signal_shape


@dataclass
class NeuronStep:
    """What one neuron growth step did: per layer, the neurons added and their init."""

    added: dict[str, tuple[int, str]] = field(default_factory=dict)

    def describe(self) -> str:
        """e.g. '0: +8 gradmax, 2: +8 random'."""
        return ", ".join(f"{path}: +{k} {init}" for path, (k, init) in self.added.items())


def widening_targets(model: nn.Module, pairs: Mapping[str, Any] | None = None
                     ) -> dict[str, LayerPlan]:
    """The plan entries of the wrapped layers that can gain neurons, in forward order
    (``pairs``: readers named by the user, ``PerforaConfig.neuron_pairs``)."""
    inner = unwrap_model(model)
    plan = plan_widening(inner, pairs=pairs)
    targets: dict[str, LayerPlan] = {}
    partners: set[str] = set()
    for path in dendritic_layers(inner):
        entry = plan.layers.get(path)
        if entry is not None and entry.widenable and path not in partners \
                and frozen_reason(inner, entry) is None:
            targets[path] = entry  # Llama's gate and up widen together, once
            partners.update(entry.partners)
    return targets


def frozen_reason(model: nn.Module, entry: LayerPlan) -> str | None:
    """Why a widenable layer is not grown by the controller: it is frozen (a frozen layer
    keeps its width, as its weights), or a reader with no trainable weight
    (``requires_grad=False``) would keep the new neurons' outgoing weights at zero, so they
    could never change the output; else None."""
    if any(_frozen(model.get_submodule(p)) for p in [entry.path, *entry.partners]):
        return "it is frozen (requires_grad=False): a frozen layer keeps its width"
    for path, _ in entry.consumers:
        if _frozen(model.get_submodule(path)):
            return (f"its reader {path} is frozen (requires_grad=False): the new neurons' "
                    "outgoing weights would stay zero")
    return None


def _frozen(module: nn.Module) -> bool:
    """True when the module has weights (matrices, kernels) and none of them trains."""
    weights = [p for p in module.parameters() if p.dim() > 1]
    return bool(weights) and not any(p.requires_grad for p in weights)


def check_neuron_growth(model: nn.Module, backend: ParallelBackend, config: PerforaConfig
                        ) -> bool:
    """Refuse ``growth='neurons'`` where no wrapped layer can gain neurons, saying why
    (before training starts). True when some layer can gain neurons (False: 'auto' grows
    dendrites only)."""
    growth = config.growth
    if growth == "auto" and config.rule != "gd":
        return False  # new neurons train by backprop
    # a sharded model's structure-only copy holds the shapes (ZeRO-3's slices do not)
    inner = unwrap_model(backend.template if backend.sharded and backend.template is not None
                         else model)
    wrapped, modules = dendritic_layers(inner), dict(inner.named_modules())
    unwrapped = [p for p in (config.neuron_pairs or {}) if p in modules and p not in wrapped]
    if unwrapped:
        raise PerforationError(f"neuron_pairs names {unwrapped[0]!r}, which perforate did not "
                               f"wrap: only wrapped layers gain neurons (wrapped: "
                               f"{sorted(wrapped)[:8]}); wrap it too, e.g. perforate(model, "
                               f"paths=[..., {unwrapped[0]!r}])")
    if widening_targets(inner, config.neuron_pairs):
        return True
    plan: WideningPlan = plan_widening(inner, pairs=config.neuron_pairs)
    reasons = [f"{p}: {plan.layers[p].reason or frozen_reason(inner, plan.layers[p])}"
               for p in dendritic_layers(inner) if p in plan.layers]
    reasons = [re.sub(r"(?<!neuron_)\bpairs=", "neuron_pairs=", r) for r in reasons]  # the
    # planner's argument is the controller's setting neuron_pairs
    why = "; ".join(reasons) or "no Linear/Conv layer is wrapped"
    remedy = ("wrap the layers whose outputs another wrapped-or-plain Linear/Conv reads, name "
              "their readers with the setting neuron_pairs={path: [reader paths]}")
    if growth == "neurons":
        raise PerforationError(f"growth='neurons': no wrapped layer can gain neurons ({why}); "
                               f"{remedy}, or use growth='dendrites'")
    if config.max_neuron_steps > 0:  # auto, where neurons were not ruled out by the user
        warnings.warn(f"growth='auto' will grow dendrites only: no wrapped layer can gain "
                      f"neurons ({why}). To grow neurons too, {remedy}; growth='dendrites' "
                      "says dendrites are what you want (and silences this)", UserWarning,
                      stacklevel=3)
    return False


def start_width(layer: nn.Module) -> int:
    """The width a layer had before any widening (its first output block)."""
    core = layer.source if isinstance(layer, DendriticLayer) else layer
    blocks = getattr(core, "out_blocks", None)
    return int(blocks[0]) if blocks else int(layer.num_neurons)


def _row_scale(layer: nn.Module) -> float:
    """The mean norm of the layer's incoming weight rows: the new rows' norm."""
    core = layer.source if isinstance(layer, DendriticLayer) else layer
    w = core.weight.detach().float()
    rows = w.T if is_hf_conv1d(core) else w.reshape(w.shape[0], -1)
    return float(rows.norm(dim=1).mean())


def reduce_signal(signal: WideningSignal | None, model: nn.Module,
                  targets: dict[str, LayerPlan]) -> dict[str, torch.Tensor]:
    """Per target layer with a recorded signal: ``E[g x^T]`` over all ranks (a
    collective under torch.distributed; every rank calls it with the same targets)."""
    if signal is None:
        return {}
    inner = unwrap_model(model)
    shapes = {path: signal_shape(inner, targets[path]) for path in signal.paths
              if path in targets}
    return signal.reduced(shapes)


def step_size(layer: nn.Module, config: PerforaConfig, multiple: int = 1,
              chunks: int = 1) -> int:
    """Neurons one step adds to ``layer``: ``neurons_per_step`` of its starting width,
    rounded up to a ``multiple`` (a GroupNorm's group size on the way); a fused gate-and-up
    layer's width is its rows over its ``chunks``."""
    k = max(1, int(config.neurons_per_step * start_width(layer) / chunks + 0.5))
    return -(-k // multiple) * multiple


def widen_layers(model: nn.Module, config: PerforaConfig, state: ControllerState,
                 targets: dict[str, LayerPlan], chosen: list[str],
                 sums: dict[str, tuple[torch.Tensor, torch.Tensor]],
                 scope: PairScope | None = None) -> NeuronStep:
    """Widen the ``chosen`` targets (last first), GradMax rows where ``sums`` has a signal;
    each inside ``scope(entry)`` (default: the model itself)."""
    inner = unwrap_model(model)
    step = NeuronStep()
    for path in reversed([p for p in targets if p in chosen]):
        opened = scope(targets[path]) if scope is not None else contextlib.nullcontext(inner)
        with opened as root:
            layer = root.get_submodule(path)
            k = step_size(layer, config, neuron_multiple(root, targets[path]),
                          targets[path].chunks)
            seed = zlib.crc32(f"{config.seed}:{state.additions}:{path}:neurons".encode())
            gen = torch.Generator().manual_seed(seed)
            init, how = None, "random"
            if config.neuron_init == "gradmax" and path in sums \
                    and bool(sums[path].abs().sum() > 0):
                init = gradmax_rows(sums[path], k, _row_scale(layer), gen)
                how = "gradmax"
            widen(root, targets[path], k, init=init, generator=gen)
        step.added[path] = (k, how)
    step.added = dict(reversed(list(step.added.items())))
    return step


def grow_neurons(model: nn.Module, config: PerforaConfig, state: ControllerState,
                 signal: WideningSignal | None, scope: PairScope | None = None) -> NeuronStep:
    """Widen every wrapped layer that can gain neurons, in place; records the step in
    ``state``. ``model`` is the unsharded model, or a sharded model's structure with
    ``scope`` making each pair whole in turn. The caller re-wraps the model and rebuilds
    what trains."""
    targets = widening_targets(model, config.neuron_pairs)
    step = widen_layers(model, config, state, targets, list(targets),
                        reduce_signal(signal, model, targets), scope)
    if signal is not None:
        signal.clear()
    record_growth(state, model, "neurons")
    return step


def arm_widening_signal(signal: WideningSignal | None, model: nn.Module, may_grow: bool,
                        structure: nn.Module | None = None,
                        pairs: Mapping[str, Any] | None = None) -> None:
    """Record the widening signal only in an epoch that a growth step may follow, and only that
    epoch's (what an epoch that grew nothing recorded is dropped). The hooks
    go on ``model``; the layers to record are planned on ``structure`` (a sharded model's
    unsharded copy, whose shapes its slices hide; default: ``model``) with the user's
    ``pairs``."""
    if signal is None:
        return
    signal.disarm()  # the layers may be new objects after a restructure
    signal.clear()  # only the epoch before a step counts (as a resumed run would see it)
    if may_grow:
        signal.arm(unwrap_model(model), widening_targets(
            structure if structure is not None else model, pairs))
