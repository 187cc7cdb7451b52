"""Typed exceptions: every failure says what was wrong and how to fix it."""

from __future__ import annotations

from typing import Any


class PerforaError(Exception):
    """Base class of every error perfora raises on purpose."""


class ConfigError(PerforaError, ValueError):
    """A setting is unknown, has the wrong type, or is out of range."""


class ScoreError(PerforaError, ValueError):
    """A score given to the controller is not a finite number."""


class OrderError(PerforaError, RuntimeError):
    """A call was made in the wrong order (e.g. a step after training completed)."""


class ConversionError(PerforaError, ValueError):
    """The common base of :class:`PerforationError`, :class:`ParallelError` and
    :class:`ExportError`; kept so that ``except ConversionError`` in existing code still
    catches all three. New code catches the specific one."""


class PerforationError(ConversionError):
    """The model cannot be perforated as asked (nothing to wrap, unknown neuron axis,
    an unsupported layer such as an LSTM)."""


class ParallelError(ConversionError):
    """A parallel wrapper cannot be used as asked (a model sharded outside perfora, a
    wrapper given an already sharded model, a setting the backend does not support)."""


class ExportError(ConversionError):
    """A grown model cannot be exported in the asked form."""


class CheckpointError(PerforaError, RuntimeError):
    """A checkpoint is missing, corrupt, truncated, unsafe (pickle) or of another format."""


class ShapeMismatchError(CheckpointError):
    """A checkpoint does not fit the model it is loaded into."""


class RankMismatchError(PerforaError, RuntimeError):
    """Ranks disagree on the model's structure (dendrites, shapes or what trains)."""


class CompatNameError(PerforaError, AttributeError):
    """A PerforatedAI name that perfora's shell does not provide (hasattr() sees False)."""


class UnknownSettingError(ConfigError, AttributeError):
    """A ``GPA.pc`` setting that does not exist; the message names the nearest one."""


def require_bool(value: Any, name: str) -> bool:
    """``value`` if it is True or False, else a :class:`ConfigError`: a flag taken through
    ``bool()`` would silently turn on for ``"False"`` or ``"no"``."""
    if isinstance(value, bool):
        return value
    hint = " (a string: write True or False without quotes)" if isinstance(value, str) else ""
    raise ConfigError(f"{name} must be True or False, got {value!r}{hint}")
