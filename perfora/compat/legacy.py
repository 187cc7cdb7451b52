"""PerforatedAI's older spelling of the settings: module attributes of the globals module.

Before ``GPA.pc`` existed, a script wrote ``GPA.testing_dendrite_capacity = False`` or
``GPA.switch_mode = GPA.doing_fixed_switch`` (PerforatedAI's own MNIST example still does).
:class:`GlobalsModule` becomes the class of ``perfora.compat.globals_perforatedai``, so these
assignments set ``GPA.pc`` and reading them gives ``GPA.pc``'s value. Names: every ``GPA.pc``
setting (lower or UPPER case, as the releases spelled them), the renamed ones in
:data:`RENAMED`, and the old selection lists ``modules_to_convert`` /
``module_names_to_convert`` (translated, see :class:`_SelectionList`). Any other new
attribute is an error naming the nearest setting.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from typing import Any

from ..config import nearest_name
from ..errors import ConfigError, UnknownSettingError
from .module_selection import _TORCH_LAYERS
from .settings import SETTINGS, PAISettings

RENAMED = {"input_dimensions": "output_dimensions",
           "debugging_input_dimensions": "debugging_output_dimensions",
           "pb_forward_function": "pai_forward_function",
           "module_ids_to_convert": "module_ids_to_perforate"}
"""Old module-attribute names whose ``GPA.pc`` setting has another name."""

CONSTANTS = {"doing_switch_every_time": 0, "doing_history": 1, "doing_fixed_switch": 2,
             "doing_no_switch": 3, "param_vals_by_total_epoch": 0,
             "param_vals_by_update_epoch": 1, "param_vals_by_neuron_epoch_start": 2}
"""The old module's lower-case constants (``GPA.switch_mode = GPA.doing_history``)."""

SELECTION = ("modules_to_convert", "module_names_to_convert")
"""The old selection lists: types (default every Linear/Conv) and class names (default
``['PAISequential']``), which ``GPA.pc`` folds into ``module_names_to_perforate``."""

REFUSED = {"module_names_to_skip": "GPA.pc.set_module_ids_to_track(['.path.to.module'])"}
"""Old names perfora cannot translate exactly: the ``GPA.pc`` call to use instead."""


def setting_for(attr: str) -> str | None:
    """The ``GPA.pc`` setting an old module attribute stands for (None: not a setting)."""
    name = attr.lower() if attr.isupper() else attr
    name = RENAMED.get(name, name)
    return name if name in SETTINGS else None


class _SelectionList(list):
    """What ``GPA.modules_to_convert`` reads as: a list whose changes (``append``,
    ``extend``, ``+=``, ...) are written back to ``GPA.pc``, as the old module list was."""

    def __init__(self, values: Iterable[Any], write: Callable[[list[Any]], None]) -> None:
        super().__init__(values)
        self._write = write

    def _changed(self) -> None:
        self._write(list(self))


def _mutator(name: str) -> Callable[..., Any]:
    method = getattr(list, name)

    def call(self: _SelectionList, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        self._changed()
        return result

    call.__name__ = name
    call.__doc__ = f"list.{name}, written back to GPA.pc."
    return call


for _name in ("append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse",
              "__setitem__", "__delitem__", "__iadd__"):
    setattr(_SelectionList, _name, _mutator(_name))


def read_selection(pc: PAISettings, attr: str) -> list[Any]:
    """The old list's value from ``GPA.pc`` (a live list: changes are written back)."""
    names = list(pc.get("module_names_to_perforate"))
    if attr == "modules_to_convert":
        value = list(pc.get("modules_to_perforate"))
        value += [_TORCH_LAYERS[n] for n in names if n in _TORCH_LAYERS
                  and _TORCH_LAYERS[n] not in value]
    else:
        value = [n for n in names if n not in _TORCH_LAYERS]
    return _SelectionList(value, lambda new: write_selection(pc, attr, new))


def write_selection(pc: PAISettings, attr: str, value: Any) -> None:
    """Set the old list: the same modules get dendrites as under PerforatedAI's old module.

    ``modules_to_convert = [...]`` replaces the layer types (the Linear/Conv names in
    ``module_names_to_perforate`` stand for the old default types, so they go);
    ``module_names_to_convert = [...]`` replaces the class names and keeps the types.
    """
    if not isinstance(value, list | tuple):
        raise ConfigError(f"GPA.{attr} needs a list, got {value!r}")
    names = list(pc.get("module_names_to_perforate"))
    if attr == "modules_to_convert":
        pc.set("modules_to_perforate", list(value))
        pc.set("module_names_to_perforate", [n for n in names if n not in _TORCH_LAYERS])
    else:
        pc.set("module_names_to_perforate",
               [n for n in names if n in _TORCH_LAYERS] + list(value))


def unknown_attribute_message(module: str, attr: str) -> str:
    """'GPA.x is not a setting; did you mean GPA.pc.set_y?'."""
    close = nearest_name(attr.lower(), list(SETTINGS) + list(RENAMED) + list(SELECTION))
    hint = ""
    if close:
        hint = f"; did you mean GPA.pc.set_{setting_for(close) or close}(...)"
        if close in SELECTION:
            hint = f"; did you mean GPA.{close}"
    return (f"{module}.{attr} is not a PerforatedAI setting perfora knows, so assigning it "
            f"would change nothing{hint}? Settings are set with GPA.pc.set_<name>(value) (see "
            "perfora.compat.settings.SETTINGS)")


class GlobalsModule(types.ModuleType):
    """The class of the ``GPA`` module: old-style setting assignments reach ``GPA.pc``."""

    def __setattr__(self, attr: str, value: Any) -> None:
        if attr.startswith("__") or attr in self.__dict__:
            super().__setattr__(attr, value)  # module machinery, monkeypatching
            return
        pc: PAISettings = self.__dict__["pc"]
        setting = setting_for(attr)
        if setting is not None:
            pc.set(setting, value)
        elif attr in SELECTION:
            write_selection(pc, attr, value)
        elif attr in REFUSED:
            raise UnknownSettingError(f"GPA.{attr} is not supported by perfora: use "
                                      f"{REFUSED[attr]} instead")
        else:
            raise UnknownSettingError(unknown_attribute_message("GPA", attr))

    def __delattr__(self, attr: str) -> None:
        if attr in self.__dict__:
            super().__delattr__(attr)
            return
        raise AttributeError(f"GPA.{attr} cannot be deleted; GPA.reset() restores the "
                             "defaults")


def legacy_value(pc: PAISettings, attr: str) -> tuple[bool, Any]:
    """(True, value) when ``attr`` is an old module attribute; (False, None) otherwise."""
    setting = setting_for(attr)
    if setting is not None:
        return True, pc.get(setting)
    if attr in SELECTION:
        return True, read_selection(pc, attr)
    if attr in CONSTANTS:
        return True, CONSTANTS[attr]
    if attr in REFUSED:
        raise UnknownSettingError(f"GPA.{attr} is not supported by perfora: use "
                                  f"{REFUSED[attr]} instead")
    return False, None
