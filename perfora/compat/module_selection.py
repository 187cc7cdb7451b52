"""Translate PerforatedAI's module-selection settings into :func:`perfora.perforate` arguments."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import PerforationError
from ..nn.layers import bank_kind, unwrap_model
from ..nn.perforation import NORM_TYPES
from .settings import PAISettings, activation_name

_TORCH_LAYERS: dict[str, type[nn.Module]] = {
    "Linear": nn.Linear, "Conv1d": nn.Conv1d, "Conv2d": nn.Conv2d, "Conv3d": nn.Conv3d}


class PAISequential(nn.Sequential):
    """``GPA.PAISequential([layer, norm])``: a Linear/Conv and the norm layer after it,
    perforated as one unit (the dendrites copy the layer and add to the normalised output)."""

    def __init__(self, layer_list: list[nn.Module] | tuple[nn.Module, ...]) -> None:
        super().__init__(*layer_list)


def perforate_kwargs(model: nn.Module, pc: PAISettings) -> dict[str, Any]:
    """Keyword arguments for perfora.perforate that select what GPA.pc's lists select."""
    inner = unwrap_model(model)
    names_setting = list(pc.get("module_names_to_perforate"))
    types = set(pc.get("modules_to_perforate"))
    names = set()
    for name in names_setting:
        if name in _TORCH_LAYERS:
            types.add(_TORCH_LAYERS[name])
        elif name != "PAISequential":
            names.add(name)
    paths = [str(p).lstrip(".") for p in pc.get("module_ids_to_perforate")]
    track_names = set(pc.get("module_names_to_track"))
    exclude = [str(p).lstrip(".") for p in pc.get("module_ids_to_track")]
    exclude += [path for path, m in inner.named_modules()
                if path and type(m).__name__ in track_names]
    groups = []
    if "PAISequential" in names_setting:
        for path, module in inner.named_modules():
            if isinstance(module, PAISequential):
                groups.append(_pai_sequential_pair(path, module))
                paths.append(groups[-1][0])
    return {"types": tuple(types), "names": tuple(sorted(names)), "paths": paths,
            "exclude": exclude, "exclude_types": tuple(pc.get("modules_to_track")),
            "groups": groups, "activation": activation_name(pc.get("pai_forward_function")),
            "verbose": bool(pc.get("verbose")) and not pc.get("silent")}


def _pai_sequential_pair(path: str, module: PAISequential) -> tuple[str, str]:
    children = list(module.named_children())
    if (len(children) == 2 and bank_kind(children[0][1]) != "generic"
            and isinstance(children[1][1], NORM_TYPES)):
        prefix = f"{path}." if path else ""
        return f"{prefix}{children[0][0]}", f"{prefix}{children[1][0]}"
    kinds = [type(m).__name__ for _, m in children]
    raise PerforationError(f"PAISequential at {path!r} holds {kinds}; perfora groups exactly "
                           "[Linear or Conv, norm layer]. Split it, or select modules with "
                           "GPA.pc.set_module_ids_to_perforate")
