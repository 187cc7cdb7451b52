"""``perforate``'s selectors checked and made lists: one string or class alone is a list of
one (``paths="fc1"`` used to be read letter by letter), and a wrong kind of item is a
:class:`PerforationError` that says what the selector takes."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import PerforationError


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
