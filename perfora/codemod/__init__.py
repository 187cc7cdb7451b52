"""``perfora convert``: edit a training script for perfora's API (native mode) or for the
PerforatedAI recipe with perfora.compat (compat mode); a libcst codemod.

``syntax`` answers small questions about libcst nodes, ``finders`` each find one part of a
script (with line numbers) and ``analysis`` composes them, ``native_edits`` and
``compat_edits`` turn them into edits for each mode (``common`` holds what both share),
``edits`` applies them keeping every comment, ``api`` is ``convert_source``;
:mod:`perfora.cli.convert` prints diffs, writes files and reports what must be done by hand.
"""

from .api import ScriptError, convert_source
from .common import ConvertOptions
from .findings import CodemodResult, ConversionResult, Finding

__all__ = ["convert_source", "CodemodResult", "ConversionResult", "Finding", "ConvertOptions",
           "ScriptError"]
