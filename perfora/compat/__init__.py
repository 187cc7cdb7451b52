"""PerforatedAI-compatible names over perfora's objects. Swap the two imports::

    from perfora.compat import globals_perforatedai as GPA
    from perfora.compat import utils_perforatedai as UPA

and a script written for the PerforatedAI API runs on perfora. ``GPA.pc`` (settings) and
``GPA.pai_tracker`` (over one :class:`perfora.GrowthController`) are the only module-level
state in perfora.
"""

from ..errors import CompatNameError, UnknownSettingError
from . import globals_perforatedai, utils_perforatedai

__all__ = ["globals_perforatedai", "utils_perforatedai", "CompatNameError",
           "UnknownSettingError"]
