"""``perfora convert``: apply the seed's edits to a training script (a libcst codemod).

``syntax`` answers small questions about libcst nodes, ``analysis`` finds the parts of a
script (with line numbers), ``native`` and ``compat`` turn them into edits for each mode
(``common`` holds what both share), ``edits`` applies them keeping every comment, ``api``
is ``convert_source``; :mod:`perfora.cli.convert` prints diffs, writes files and reports
what must be done by hand.
"""

from .api import ScriptError, convert_source
from .common import ConvertOptions
from .findings import ConversionResult, Finding

__all__ = ["convert_source", "ConversionResult", "Finding", "ConvertOptions", "ScriptError"]
