"""What the converter tells the user: findings with line numbers, and the codemod's result."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

MANUAL = "manual"
NOTE = "note"


@dataclass(frozen=True)
class Finding:
    """One message about the script: ``manual`` (do this by hand) or ``note`` (what was done)."""

    line: int
    message: str
    kind: str = MANUAL

    def format(self, path: str = "<script>") -> str:
        """``path:line: kind: message``, the compiler-style line editors can jump to."""
        return f"{path}:{self.line}: {self.kind}: {self.message}"


@dataclass
class CodemodResult:
    """The converted source, the mode used and what the user must still do by hand."""

    source: str
    output: str
    mode: str
    findings: list[Finding] = field(default_factory=list)
    already_converted: bool = False

    @property
    def changed(self) -> bool:
        """True when the conversion changes the script."""
        return self.output != self.source

    @property
    def manual(self) -> list[Finding]:
        """The findings the user must act on."""
        return [f for f in self.findings if f.kind == MANUAL]

    def diff(self, path: str = "train.py") -> str:
        """A unified diff from the original to the converted script ('' when unchanged)."""
        return "".join(difflib.unified_diff(
            self.source.splitlines(keepends=True), self.output.splitlines(keepends=True),
            fromfile=f"a/{path.lstrip('/')}", tofile=f"b/{path.lstrip('/')}"))


ConversionResult = CodemodResult
"""The earlier name of :class:`CodemodResult` (kept importable; the same class)."""
