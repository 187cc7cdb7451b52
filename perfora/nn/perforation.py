"""Choose which modules of a model get dendrites, and wrap them in DendriticLayer."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import (
    CheckpointError,
    ConversionError,
    PerforationError,
    ShapeMismatchError,
    require_bool,
)
from .attention import is_attention_projection, route_wrapped_layers
from .blocks import is_hf_conv1d
from .layers import DendriticLayer, bank_kind, dendritic_layers, unwrap_model
from .plain_keys import add_plain_key_hook
from .refusals import (
    PARAMETRIZED,
    RECURRENT,
    not_one_tensor,
    parametrized_inside,
    recurrent_error,
    refuse_unsupported,
)
from .resize_head import add_resize_hook
from .saved_widths import add_width_hook
from .selectors import check_consistent, module_types, string_list
from .tied import rename_tied_keys, tie_reason, tied_modules
from .widening import replay_widenings

log = logging.getLogger("perfora")

DEFAULT_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.RMSNorm,
)
_NEURON_ATTRS = ("out_features", "out_channels", "num_features", "embedding_dim")

Predicate = Callable[[str, nn.Module], bool]


@dataclass
class WrappedLayer:
    """One wrapped module: where it is, what it was, how many neurons it has."""

    path: str
    type: str
    neurons: int
    neuron_axis: int
    dendrites: int
    grouped_with: str | None = None
    base_frozen: bool = False
    started_with: int | None = None  # the neurons it had before neuron growth (if widened)
    fed: list[int] | None = None  # neurons each dendrite set feeds, where some feed only some


@dataclass
class ConversionReport:
    """What ``perforate`` wrapped, and which trainable parameters it left outside."""

    wrapped: list[WrappedLayer] = field(default_factory=list)
    outside: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why) of this call

    def __str__(self) -> str:
        lines = [f"perfora wrapped {len(self.wrapped)} module(s):"]
        width = max((len(w.path) for w in self.wrapped), default=4)
        for w in self.wrapped:
            group = f" + {w.grouped_with}" if w.grouped_with else ""
            frozen = "  base frozen (only dendrites train)" if w.base_frozen else ""
            grown = f" (started with {w.started_with})" if w.started_with else ""
            sets = f" (sets feed {', '.join(map(str, w.fed))} of {w.neurons} neurons)" \
                if w.fed else ""
            lines.append(f"  {w.path:<{width}}  {w.type}{group}  neurons={w.neurons}{grown} "
                         f"axis={w.neuron_axis} dendrites={w.dendrites}{sets}{frozen}")
        for path, why in self.skipped:
            lines.append(f"  skipped {path}: {why}")
        if self.outside:
            total = sum(n for _, n in self.outside)
            lines.append(f"trainable parameters left outside ({total} values, no dendrites):")
            lines += [f"  {name} ({n})" for name, n in self.outside]
        else:
            lines.append("no trainable parameter left outside the wrapped modules")
        return "\n".join(lines)


def _norm_path(path: str) -> str:
    return path.strip().lstrip(".")


def _excluded(path: str, module: nn.Module, exclude: Sequence[str],
              exclude_types: tuple[type, ...]) -> bool:
    if exclude_types and isinstance(module, exclude_types):
        return True
    return any(path == e or path.startswith(e + ".") for e in exclude)


def perforate(
    model: nn.Module,
    *,
    types: type[nn.Module] | Iterable[type[nn.Module]] | None = None,
    names: str | Iterable[str] = (),
    paths: str | Iterable[str] = (),
    predicate: Predicate | None = None,
    exclude: str | Iterable[str] = (),
    exclude_types: type[nn.Module] | Iterable[type[nn.Module]] = (),
    group_norms: bool = False,
    groups: Iterable[tuple[str, str]] = (),
    neuron_axes: Mapping[str, int] | None = None,
    num_neurons: Mapping[str, int] | None = None,
    example_input: torch.Tensor | tuple | None = None,
    activation: str = "sigmoid",
    verbose: bool = False,
) -> nn.Module:
    """Wrap the selected modules of ``model`` in place in :class:`DendriticLayer` and return it.

    Selection: ``types`` (when no other selector is given, Linear, Conv1d/2d/3d and Hugging
    Face's Conv1D), class ``names``, dotted ``paths`` and a ``predicate(path, module)``;
    ``exclude`` (paths or prefixes) and ``exclude_types`` win over them; one string or class
    alone is a list of one. ``group_norms`` groups a norm layer that directly follows a
    selected layer inside an ``nn.Sequential`` with it (explicit pairs go in ``groups``).
    Modules other than Linear/Conv need their neuron axis in ``neuron_axes`` (by path or class
    name); their neuron count comes from ``num_neurons``, a size attribute or one forward pass
    of ``example_input``. See :func:`describe` for the report.
    """
    if not isinstance(model, nn.Module):
        raise PerforationError(f"perforate() needs an nn.Module, got {type(model).__name__}")
    group_norms = require_bool(group_norms, "group_norms")
    verbose = require_bool(verbose, "verbose")
    inner = unwrap_model(model)
    paths = [_norm_path(p) for p in string_list(paths, "paths")]
    names = set(string_list(names, "names"))
    exclude = [_norm_path(e) for e in string_list(exclude, "exclude")]
    exclude_types = module_types(exclude_types, "exclude_types")
    if types is None:
        types = () if (paths or names or predicate) else DEFAULT_TYPES
        if types:  # the default also takes Hugging Face's Conv1D (GPT-2's layers)
            predicate = _is_hf_conv1d
    types = module_types(types, "types")
    neuron_axes = dict(neuron_axes or {})
    num_neurons = dict(num_neurons or {})
    pair_map = {_norm_path(a): _norm_path(b) for a, b in groups}

    modules = dict(inner.named_modules(remove_duplicate=False))
    for p in list(paths) + list(pair_map) + list(pair_map.values()) + exclude:
        if p not in modules:
            raise PerforationError(f"no module at path {p!r}; paths look like "
                                   f"{_example_paths(modules)}")

    selected: list[str] = []
    skipped: list[tuple[str, str]] = []
    ties = tied_modules(inner)
    _select(inner, "", types, names, set(paths), predicate, exclude, exclude_types, selected,
            skipped, ties)
    selected = _first_path_per_module(selected, modules)
    check_consistent(paths, exclude, selected, pair_map,
                     {"neuron_axes": neuron_axes, "num_neurons": num_neurons}, modules,
                     NORM_TYPES)
    existing = dendritic_layers(inner)
    if not selected and not existing:
        if len(modules) == 1 and isinstance(inner, DEFAULT_TYPES):
            raise PerforationError(
                f"the model is a single {type(inner).__name__} with no layers inside: perforate "
                "wraps the layers of a model and returns the model, so put the layer in a "
                f"container first, e.g. perfora.perforate(nn.Sequential(layer))")
        recurrent = [(p, m) for p, m in modules.items() if isinstance(m, RECURRENT)]
        if recurrent and types == DEFAULT_TYPES:  # why the default found nothing
            path, module = recurrent[0]
            raise recurrent_error(path, module, "; this model has no Linear or Conv layer")
        raise PerforationError(
            "nothing to perforate: no module matched the selection (types="
            f"{[t.__name__ for t in types]}, names={sorted(names)}, paths={paths}). "
            f"Modules in this model: {_example_paths(modules, 12)}"
            + "".join(f"; skipped {p}: {why}" for p, why in skipped)
            + _unselected_classes(modules))

    if group_norms:
        pair_map.update(_sequential_norm_pairs(inner, selected, exclude, exclude_types))
    axes = {path: _axis_for(path, modules[path], neuron_axes) for path in selected}
    sizes = _neuron_sizes(inner, selected, neuron_axes, num_neurons, example_input)
    aliases = _alias_paths(inner)
    for path in selected:
        module = modules[path]
        axis = axes[path]
        norm_path = pair_map.get(path)
        base: nn.Module = module
        if norm_path is not None:
            base = nn.Sequential(module, modules[norm_path])
            _set_module(inner, norm_path, nn.Identity())
        layer = DendriticLayer(base, num_neurons=sizes[path], neuron_axis=axis,
                               activation=activation, grouped=norm_path is not None)
        layer.perforate_path = path
        layer.grouped_with = norm_path
        for alias in aliases.get(id(module), [path]):
            _set_module(inner, alias, layer)
            if id(module) in ties:  # named in paths=: grown with the tie kept
                rename_tied_keys(inner, alias, f"{alias}.base.0" if norm_path else
                                 f"{alias}.base")
    route_wrapped_layers(inner)
    add_width_hook(inner)  # a state dict of wider layers widens them first, then loads
    add_plain_key_hook(inner)  # a plain model's checkpoint loads too (grouped norms' keys)
    add_resize_hook(inner)  # resize_token_embeddings resizes a wrapped lm_head's dendrites
    report = describe(model)
    report.skipped = skipped
    if verbose:
        print(report)
    else:
        log.info("%s", report)
    return model


def _select(module: nn.Module, prefix: str, types: tuple, names: set, paths: set,
            predicate: Predicate | None, exclude: Sequence[str], exclude_types: tuple,
            out: list[str], skipped: list[tuple[str, str]],
            ties: Mapping[int, list[tuple[str, str]]]) -> None:
    for child_name, child in module.named_children():
        path = f"{prefix}.{child_name}" if prefix else child_name
        if isinstance(child, DendriticLayer) or _excluded(path, child, exclude, exclude_types):
            continue
        hit = (path in paths or (types and isinstance(child, types))
               or type(child).__name__ in names
               or (predicate is not None and predicate(path, child)))
        if hit and path not in paths and is_attention_projection(module, child_name):
            skipped.append((path, f"{type(module).__name__} reads its weight directly; "
                                  f"name it in paths=[{path!r}] to grow it anyway (perfora "
                                  "then routes the attention output through it)"))
            continue
        if hit and path not in paths and parametrized_inside(child):
            skipped.append((path, f"{PARAMETRIZED}; remove the parametrization to grow it "
                                  "(torch.nn.utils.parametrize.remove_parametrizations)"))
            continue
        if hit and (why := not_one_tensor(child)) is not None:
            if path in paths:  # named: say why it cannot be grown, before anything changes
                raise PerforationError(f"perforate: {path}: {why}")
            skipped.append((path, why))
            continue
        if hit and path not in paths and id(child) in ties:
            skipped.append((path, tie_reason(path, ties[id(child)])))
            continue
        if hit:
            refuse_unsupported(path, child)
            if path not in out:
                out.append(path)
        else:
            _select(child, path, types, names, paths, predicate, exclude, exclude_types, out,
                    skipped, ties)


def _first_path_per_module(paths: list[str], modules: Mapping[str, nn.Module]) -> list[str]:
    """One path per module: a module reachable by several paths is wrapped once."""
    seen: set[int] = set()
    out: list[str] = []
    for path in paths:
        if id(modules[path]) not in seen:
            seen.add(id(modules[path]))
            out.append(path)
    return out


def _sequential_norm_pairs(inner: nn.Module, selected: list[str], exclude: Sequence[str],
                           exclude_types: tuple) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for seq_path, seq in inner.named_modules():
        if not isinstance(seq, nn.Sequential):
            continue
        children = list(seq.named_children())
        for (name, _), (next_name, nxt) in zip(children, children[1:]):
            path = f"{seq_path}.{name}" if seq_path else name
            next_path = f"{seq_path}.{next_name}" if seq_path else next_name
            if (path in selected and isinstance(nxt, NORM_TYPES)
                    and not _excluded(next_path, nxt, exclude, exclude_types)):
                pairs[path] = next_path
    return pairs


def _is_hf_conv1d(path: str, module: nn.Module) -> bool:
    return is_hf_conv1d(module)


def _axis_for(path: str, module: nn.Module, neuron_axes: Mapping[str, int]) -> int:
    if path in neuron_axes:
        return int(neuron_axes[path])
    if type(module).__name__ in neuron_axes:
        return int(neuron_axes[type(module).__name__])
    if is_hf_conv1d(module):
        return -1  # a Linear with its weight stored [in, out]
    kind = bank_kind(module)
    if kind == "linear":
        return -1
    if kind == "conv":
        return 1
    raise PerforationError(
        f"{path!r} is a {type(module).__name__}: perfora does not know which output axis "
        f"holds its neurons. Pass neuron_axes={{{path!r}: AXIS}} (e.g. -1 for a feature "
        "axis last, 1 for channels first)")


def _neuron_sizes(inner: nn.Module, selected: list[str], neuron_axes: Mapping[str, int],
                  num_neurons: Mapping[str, int], example_input) -> dict[str, int]:
    modules = dict(inner.named_modules(remove_duplicate=False))
    sizes: dict[str, int] = {}
    missing: list[str] = []
    for path in selected:
        module = modules[path]
        if path in num_neurons:
            sizes[path] = int(num_neurons[path])
        elif is_hf_conv1d(module):
            sizes[path] = int(module.nf)
        elif bank_kind(module) != "generic":
            width = getattr(module, "out_features", None)
            sizes[path] = int(module.out_channels if width is None else width)
        else:
            missing.append(path)
    if missing and example_input is not None:
        sizes.update(_probe_sizes(inner, missing, neuron_axes, example_input))
        missing = [p for p in missing if p not in sizes]
    for path in missing:
        module = modules[path]
        for attr in _NEURON_ATTRS:
            if isinstance(getattr(module, attr, None), int):
                sizes[path] = getattr(module, attr)
                break
        else:
            raise PerforationError(
                f"cannot tell how many neurons {path!r} ({type(module).__name__}) has: pass "
                f"num_neurons={{{path!r}: N}} or example_input=<one batch>")
    return sizes


def _probe_sizes(inner: nn.Module, paths: list[str], neuron_axes: Mapping[str, int],
                 example_input) -> dict[str, int]:
    """Run one forward pass and read each module's output size along its neuron axis."""
    modules = dict(inner.named_modules(remove_duplicate=False))
    sizes: dict[str, int] = {}
    handles = []
    for path in paths:
        axis = _axis_for(path, modules[path], neuron_axes)

        def hook(_m, _inp, out, path=path, axis=axis):
            if isinstance(out, torch.Tensor):
                sizes[path] = int(out.shape[axis])

        handles.append(modules[path].register_forward_hook(hook))
    try:
        with torch.no_grad():
            args = example_input if isinstance(example_input, tuple) else (example_input,)
            inner(*args)
    finally:
        for h in handles:
            h.remove()
    return sizes


def _alias_paths(inner: nn.Module) -> dict[int, list[str]]:
    aliases: dict[int, list[str]] = {}
    for path, module in inner.named_modules(remove_duplicate=False):
        if path:
            aliases.setdefault(id(module), []).append(path)
    return aliases


def _set_module(root: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, name, new)


def _example_paths(modules: Mapping[str, nn.Module], limit: int = 6) -> str:
    shown = [f"{p} ({type(m).__name__})" for p, m in modules.items() if p][:limit]
    return ", ".join(shown) or "(no submodules)"


def _unselected_classes(modules: Mapping[str, nn.Module]) -> str:
    """A hint naming the layer classes with their own weights, to select by ``names=``."""
    found = sorted({type(m).__name__ for m in modules.values()
                    if any(True for _ in m.parameters(recurse=False))
                    and not isinstance(m, (nn.Embedding, *NORM_TYPES))})
    if not found:
        return ""
    return (f". Classes with their own weights here: {found}; select one by names=[...] "
            "(with neuron_axes={name: AXIS} and example_input= for a class perfora does not "
            "know, e.g. neuron_axes={'MyLayer': -1} for a layer whose features are last)")


def _class_name(module: nn.Module) -> str:
    """The class the user wrote (a widened layer's class is perfora's subclass of it)."""
    for cls in type(module).__mro__:
        if not cls.__name__.startswith("Blocked") and issubclass(cls, nn.Module):
            return cls.__name__
    return type(module).__name__


def describe(model: nn.Module) -> ConversionReport:
    """What is wrapped (path, type, neurons, dendrites) and which trainable params are not."""
    inner = unwrap_model(model)
    layers = dendritic_layers(inner)
    report = ConversionReport()
    for path, layer in layers.items():
        blocks = getattr(layer.source, "out_blocks", None)
        report.wrapped.append(WrappedLayer(
            path=path, type=_class_name(layer.source), neurons=layer.num_neurons,
            neuron_axis=layer.neuron_axis, dendrites=layer.num_dendrites,
            grouped_with=getattr(layer, "grouped_with", None),
            base_frozen=layer.base_frozen(),
            started_with=int(blocks[0]) if blocks and len(blocks) > 1 else None,
            fed=[len(f) for f in layer.set_neurons() or []] or None))
    inside = {id(p) for layer in layers.values() for p in layer.parameters()}
    for name, p in inner.named_parameters():
        if p.requires_grad and id(p) not in inside:
            lazy = isinstance(p, nn.parameter.UninitializedParameter)  # no size yet
            report.outside.append((name, 0 if lazy else p.numel()))
    return report


def layer_specs(model: nn.Module) -> dict[str, dict]:
    """Per-layer structure (JSON-able) used by checkpoints to rebuild a model."""
    specs = {}
    for path, layer in dendritic_layers(model).items():
        spec = layer.structure()
        spec["grouped_with"] = getattr(layer, "grouped_with", None)
        specs[path] = spec
    return specs


def rebuild_structure(model: nn.Module, specs: Mapping[str, Mapping]) -> None:
    """Make ``model`` (converted or not) have exactly the structure in ``specs``."""
    inner = unwrap_model(model)
    layers = dendritic_layers(inner)
    missing = [p for p in specs if p not in layers]
    if missing and layers:
        extra = sorted(set(layers) - set(specs))
        raise PerforationError(
            f"this model is perforated differently from the checkpoint: layers {missing} are "
            f"not wrapped here{f' and {extra} are wrapped only here' if extra else ''}; "
            "perforate it with the same selection, or pass an unconverted model")
    if missing:
        perforate(
            inner, types=(), paths=list(specs),
            groups=[(p, s["grouped_with"]) for p, s in specs.items() if s.get("grouped_with")],
            neuron_axes={p: s["neuron_axis"] for p, s in specs.items()},
            num_neurons={p: s["num_neurons"] - sum(int(e.get("k", 0))
                                                   for e in s.get("widened") or [])
                         for p, s in specs.items() if s.get("kind") == "generic"},
            activation=next(iter(specs.values()))["activation"] if specs else "sigmoid")
        layers = dendritic_layers(inner)
    extra = sorted(set(layers) - set(specs))
    if extra:
        raise PerforationError(f"layers {extra} are wrapped in the model but not in the "
                               "checkpoint; load into a model perforated the same way")
    for path, spec in specs.items():
        if spec.get("widened") or getattr(layers[path], "widenings", None):
            replay_widenings(inner, path, list(spec.get("widened") or []))
    for path, spec in specs.items():
        layer = layers[path]
        if layer.num_neurons != spec["num_neurons"]:
            grown = sum(int(e.get("k", 0)) for e in spec.get("widened") or [])
            here = (f"was built with {layer.num_neurons - grown} neurons here, but the saved "
                    f"run started from {spec['num_neurons'] - grown} (and grew {grown} more)"
                    if grown else f"has {layer.num_neurons} neurons here but "
                    f"{spec['num_neurons']} in the checkpoint")
            raise PerforationError(
                f"layer {path!r} {here}: build the model with the same shape as the run "
                "that saved it")
        layer.activation = spec["activation"]
        neurons = spec.get("neurons")
        if layer.num_dendrites != spec["num_dendrites"] or layer.set_neurons() != neurons:
            layer.resize(spec["num_dendrites"], neurons)


def fit_structure(model: nn.Module, specs: Mapping[str, Mapping[str, Any]], source: str,
                  error: type[CheckpointError] = ShapeMismatchError) -> None:
    """rebuild_structure with its ConversionError turned into ``error`` naming ``source``
    (by default ShapeMismatchError: the model does not fit the saved structure)."""
    try:
        rebuild_structure(model, specs)
    except ConversionError as exc:
        raise error(f"{source}: {exc}") from exc
