"""Warnings that point at the user's line, not at perfora's.

A misuse warning is only useful where the user can act on it: at their ``controller.step()``
call, not at the perfora line that noticed. :func:`warn_user` sets the stack level to the
first caller outside the perfora package, however deep inside perfora the check runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


_CONTEXTLIB = os.path.abspath(contextlib.__file__)


def _inside_perfora(filename: str) -> bool:
    """perfora's own frames, and contextlib's between them (a perfora context manager)."""
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE) or path == _CONTEXTLIB


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside perfora."""
    frame = sys._getframe(1)  # warn_user's caller: stacklevel 2
    level = 2
    while frame is not None and _inside_perfora(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
