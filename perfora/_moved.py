"""Old import paths of moved modules: they keep working for one release, with a warning."""

from __future__ import annotations

import importlib
import sys
import warnings


def alias_moved_module(old: str, new: str) -> None:
    """Make module ``old`` the same object as ``new`` and warn once that it moved.

    Called from the old module's file; ``import old`` and ``from old import name`` then
    give ``new``'s objects, so nothing exists twice.
    """
    warnings.warn(f"{old} moved to {new}; the old import path will be removed in the next "
                  "release", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
