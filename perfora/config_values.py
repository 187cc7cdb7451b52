"""One setting's value checked and normalised for :class:`perfora.PerforaConfig`: the
checks each setting's validation is built from, each raising ConfigError with the fix."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ConfigError, require_bool


def plain_scalars(cfg: Any) -> None:
    """NumPy scalars (``np.int64(3)`` from a sweep's grid, ``np.float32(0.5)``,
    ``np.bool_``) as the Python values they hold, so they pass the checks and save as JSON."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
            plain = value.item()
            if isinstance(plain, bool | int | float):
                setattr(cfg, f.name, plain)


def check_bool(cfg: Any, name: str) -> None:
    require_bool(getattr(cfg, name), name)


def check_int(cfg: Any, name: str, minimum: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
            setattr(cfg, name, value)
        else:
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


def neuron_pairs(value: Any) -> dict[str, list[Any]] | None:
    """``neuron_pairs`` checked and made JSON-able: consumers as paths or [path, repeat]."""
    if value is None:
        return None
    example = "e.g. {'encoder.fc1': ['encoder.fc2']}"
    if not isinstance(value, Mapping):
        raise ConfigError(f"neuron_pairs must map each producer's path to its readers' paths, "
                          f"{example}; got {type(value).__name__}")
    pairs: dict[str, list[Any]] = {}
    for producer, readers in value.items():
        if not isinstance(producer, str) or not producer:
            raise ConfigError(f"neuron_pairs: a producer must be a module path, got "
                              f"{producer!r} ({example})")
        items = [readers] if isinstance(readers, str) else readers
        if not isinstance(items, Sequence) or not items:
            raise ConfigError(f"neuron_pairs[{producer!r}]: list its readers' paths, "
                              f"{example}; got {readers!r}")
        pairs[producer] = [reader(producer, item) for item in items]
    return pairs


def reader(producer: str, item: Any) -> str | list[Any]:
    if isinstance(item, str) and item:
        return item
    if isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 2 \
            and isinstance(item[0], str) and item[0] and isinstance(item[1], int) \
            and not isinstance(item[1], bool) and item[1] >= 1:
        return [item[0], item[1]]
    raise ConfigError(f"neuron_pairs[{producer!r}]: a reader is a module path, or [path, "
                      f"repeat] after a flatten (repeat: the spatial size, at least 1); got "
                      f"{item!r}")


def nonneg_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if value < 0:
        raise ConfigError(f"{name} must be >= 0, got {value}")
    return float(value)


def in_range(name: str, value: Any, high: float, what: str) -> float:
    """A finite number in (0, ``high``] as a float; otherwise ConfigError saying ``what``
    the setting means."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0 < value <= high):
        raise ConfigError(f"{name} must be {what}, got {value!r}")
    return float(value)


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``NAME=VALUE`` texts (a command line's ``--set``) as settings: each value read as JSON
    where it parses (``2``, ``0.5``, ``true``, ``"auto"``) and kept as text otherwise, so
    ``dendrite_optimizer=auto`` works unquoted. The names are checked where they are used."""
    settings: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--set {item!r}: use --set NAME=VALUE, e.g. --set "
                              "dendrite_optimizer=auto")
        try:
            settings[name.strip()] = json.loads(text)
        except json.JSONDecodeError:
            settings[name.strip()] = text
    return settings
