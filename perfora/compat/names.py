"""Module ``__getattr__`` for the shell: PerforatedAI names perfora lacks raise a clear error."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..config import nearest_name
from ..errors import CompatNameError


def missing_name_hook(module: str, public: list[str],
                      hints: Mapping[str, str]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` raising CompatNameError (an AttributeError) for ``name``."""

    def __getattr__(name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        hint = hints.get(name)
        close = nearest_name(name, public, cutoff=0.6)
        if hint:
            raise CompatNameError(f"{module}.{name} is a PerforatedAI name that perfora does "
                                  f"not provide: {hint}")
        text = (f"{module} has no name {name!r}: it is not among the PerforatedAI names "
                f"perfora provides (listed in {module}.__all__)")
        if close:
            text += f"; did you mean {module}.{close}?"
        raise CompatNameError(text)

    return __getattr__
