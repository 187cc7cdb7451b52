"""``perforate``'s selectors checked and made lists: one string or class alone is a list of
one (``paths="fc1"`` used to be read letter by letter), and a wrong kind of item is a
:class:`PerforationError` that says what the selector takes."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import PerforationError
from ..warn import warn_user


def string_list(value: Any, name: str) -> list[str]:
    """``paths=``, ``names=``, ``exclude=``: a string, or an iterable of strings."""
    items = _items(value, name, "a string or a list of strings")
    bad = [item for item in items if not isinstance(item, str)]
    if bad:
        raise PerforationError(f"{name}= takes strings (module paths or class names), got "
                               f"{bad[0]!r}")
    return items


def module_types(value: Any, name: str) -> tuple[type[nn.Module], ...]:
    """``types=``, ``exclude_types=``: an ``nn.Module`` subclass, or an iterable of them."""
    items = _items(value, name, "an nn.Module class or a list of them")
    for item in items:
        if isinstance(item, str):
            raise PerforationError(f"{name}= takes classes such as nn.Linear, got the string "
                                   f"{item!r}; class names go in names=[{item!r}]")
        if not (isinstance(item, type) and issubclass(item, nn.Module)):
            raise PerforationError(f"{name}= takes nn.Module classes such as nn.Linear, got "
                                   f"{item!r}")
    return tuple(items)


def _items(value: Any, name: str, takes: str) -> list[Any]:
    if isinstance(value, (str, type)):
        return [value]
    try:
        return list(value)
    except TypeError:
        raise PerforationError(f"{name}= takes {takes}, got {value!r}") from None


def check_consistent(paths: list[str], exclude: list[str], selected: list[str],
                     pair_map: dict[str, str], keyed: dict[str, dict[str, int]],
                     modules: dict[str, nn.Module], norm_types: tuple[type, ...]) -> None:
    """Selectors that contradict each other or name nothing, once dropped without a word:
    a ``groups`` pair whose layer is not selected or whose second module is no norm, and a
    ``neuron_axes``/``num_neurons`` key naming no module or class, are refused before the
    model changes; a ``paths=`` entry that ``exclude`` also names (exclude wins) and such a
    key naming a module or class not selected are warned about."""
    for path in paths:
        covering = [e for e in exclude if path == e or path.startswith(e + ".")]
        if covering:  # exclude winning is documented (and the compat lists rely on it): said
            warn_user(f"paths=[{path!r}] is also excluded by exclude=[{covering[0]!r}]: "
                      "exclude wins, so it is not wrapped")
    chosen = set(selected)
    for layer, norm in pair_map.items():
        if layer not in chosen:
            hint = (" (a pair is (layer, norm): the layer first)"
                    if isinstance(modules[layer], norm_types) else
                    "; select it too, e.g. paths=[" + repr(layer) + "]")
            raise PerforationError(f"groups=[({layer!r}, {norm!r})]: {layer!r} is not a "
                                   f"selected layer{hint}")
        if not isinstance(modules[norm], norm_types):
            raise PerforationError(f"groups=[({layer!r}, {norm!r})]: {norm!r} is a "
                                   f"{type(modules[norm]).__name__}, not a norm layer "
                                   f"({', '.join(t.__name__ for t in norm_types)})")
    classes = {type(m).__name__ for m in modules.values()}
    chosen_classes = {type(modules[p]).__name__ for p in chosen}
    for setting, mapping in keyed.items():
        for key in mapping:
            if key not in modules and key not in classes:
                raise PerforationError(f"{setting}= names {key!r}, which is neither a module "
                                       "path nor a class name in this model")
            if key not in chosen and key not in chosen_classes:
                warn_user(f"{setting}= names {key!r}, which is not selected, so it is not "
                          f"wrapped: naming its axis does not select it (add it to paths= or "
                          "names=)")
