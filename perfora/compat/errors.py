"""Errors of the PerforatedAI shell: unknown names are AttributeErrors that say what to do."""

from __future__ import annotations

from ..errors import ConfigError, PerforaError


class CompatNameError(PerforaError, AttributeError):
    """A PerforatedAI name that perfora's shell does not provide (hasattr() sees False)."""


class UnknownSettingError(ConfigError, AttributeError):
    """A ``GPA.pc`` setting that does not exist; the message names the nearest one."""
