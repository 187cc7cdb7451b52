"""``from perfora.compat import globals_perforatedai as GPA``: the settings ``GPA.pc`` and
the tracker ``GPA.pai_tracker`` -- the only module-level state perfora keeps.

The older spelling of the settings works too: ``GPA.testing_dendrite_capacity = False`` sets
``GPA.pc``'s value and ``GPA.testing_dendrite_capacity`` reads it (see
:mod:`perfora.compat.legacy`); assigning any other new attribute is an error.
"""

from __future__ import annotations

import sys
from typing import Any

from .legacy import GlobalsModule, legacy_value
from .module_selection import PAISequential
from .names import missing_name_hook
from .settings import (
    DOING_FIXED_SWITCH,
    DOING_HISTORY,
    DOING_NO_SWITCH,
    DOING_SWITCH_EVERY_TIME,
    PAISettings,
)
from .tracker import PAITracker

pc = PAISettings()
"""The process-wide settings (``GPA.pc.set_n_epochs_to_switch(10)``...)."""
pai_tracker = PAITracker(pc)
"""The process-wide tracker; ``UPA.perforate_model`` attaches it to the model."""


def reset() -> None:
    """Settings back to their defaults and the tracker detached (tests, notebooks)."""
    pc.reset()
    pai_tracker.reset()


__all__ = ["pc", "pai_tracker", "PAISequential", "reset", "DOING_HISTORY",
           "DOING_FIXED_SWITCH", "DOING_SWITCH_EVERY_TIME", "DOING_NO_SWITCH"]

_missing = missing_name_hook(__name__, __all__, {
    "PAIConfig": "the settings object is GPA.pc",
    "PAINeuronModuleTracker": "the tracker is GPA.pai_tracker (over perfora.GrowthController)",
})


def __getattr__(name: str) -> Any:
    """An old-style setting (``GPA.max_dendrites``) reads GPA.pc; other names are errors."""
    found, value = legacy_value(pc, name)
    if found:
        return value
    return _missing(name)


sys.modules[__name__].__class__ = GlobalsModule  # assignments of settings reach GPA.pc
