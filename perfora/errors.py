"""Typed exceptions: every failure says what was wrong and how to fix it."""

from __future__ import annotations


class PerforaError(Exception):
    """Base class of every error perfora raises on purpose."""


class ConfigError(PerforaError, ValueError):
    """A setting is unknown, has the wrong type, or is out of range."""


class ScoreError(PerforaError, ValueError):
    """A score given to the controller is not a finite number."""


class OrderError(PerforaError, RuntimeError):
    """A call was made in the wrong order (e.g. a step after training completed)."""


class ConversionError(PerforaError, ValueError):
    """The model cannot be perforated as asked (nothing to wrap, unknown neuron axis...)."""


class CheckpointError(PerforaError, RuntimeError):
    """A checkpoint is missing, corrupt, truncated, unsafe (pickle) or of another format."""


class ShapeMismatchError(CheckpointError):
    """A checkpoint does not fit the model it is loaded into."""


class RankMismatchError(PerforaError, RuntimeError):
    """Ranks disagree on the model's structure (dendrites, shapes or what trains)."""
