"""``convert_source``: one script's text in, the converted text and findings out."""

from __future__ import annotations

import ast
import gc
from typing import Any

import libcst as cst

from ..errors import PerforaError
from .analysis import find_parts
from .common import ConvertOptions
from .compat_edits import compat_edits
from .finders.tree import Tree
from .findings import MANUAL, NOTE, CodemodResult, Finding
from .native_edits import native_edits


class ScriptError(PerforaError):
    """The script could not be read as Python."""


def python_syntax_error(source: str) -> tuple[int, str] | None:
    """Where and why Python itself refuses ``source``, or None if it compiles.

    libcst's parser reports an error where its tokenizer stopped, often the line after the
    mistake (``def f(:`` on line 1 is reported on line 2); Python's own parser names the line
    a user sees in their editor, with Python's message."""
    try:
        ast.parse(source)
    except SyntaxError as exc:
        return (exc.lineno or 1), (exc.msg or "invalid syntax")
    except ValueError:  # pragma: no cover - NUL bytes; read_script refuses those first
        return None
    return None


def convert_source(source: str, mode: str = "native", **options: Any) -> CodemodResult:
    """Edit a script's text for perfora (``mode``: native) or the PerforatedAI recipe (compat).

    ``options``: ``settings`` ({name: value source}), ``run_dir`` (native), ``save_name``
    (compat), ``score`` (the name to report), ``maximize``, ``name`` (the script's stem).
    Nothing is written; parts too irregular to change are listed in ``findings``.
    """
    opts = ConvertOptions(mode=mode, **options)
    collecting = gc.isenabled()
    gc.disable()  # the syntax tree has no cycles; collecting its millions of nodes cost 1/3
    try:
        return _convert(source, mode, opts)
    finally:
        if collecting:
            gc.enable()


def _convert(source: str, mode: str, opts: ConvertOptions) -> CodemodResult:
    """:func:`convert_source` with the options checked."""
    try:
        tree = Tree(source)
    except cst.ParserSyntaxError as exc:
        line, message = python_syntax_error(source) or (exc.raw_line, exc.message)
        raise ScriptError(f"not valid Python (line {line}): {message}") from None
    script = find_parts(tree, opts.score)
    if script.already:
        swapped, lines = _swap_perforatedai_imports(script.module, tree)
        if lines and mode == "compat":
            findings = [Finding(line, "PerforatedAI import switched to perfora.compat (the "
                                "rest of the script already follows the recipe)", NOTE)
                        for line in lines]
            return CodemodResult(source, swapped.code, mode, findings)
        if lines:
            findings = [Finding(lines[0], "this script already uses the PerforatedAI API, "
                                "imported from the perforatedai package: `perfora convert "
                                "--mode compat` switches its imports to perfora.compat",
                                MANUAL)]
            return CodemodResult(source, source, mode, findings, already_converted=True)
        api = "perfora's native API" if script.already == "native" else "the compat names"
        findings = [Finding(1, f"already converted ({api}): nothing to change", NOTE)]
        return CodemodResult(source, source, mode, findings, already_converted=True)
    build = native_edits if mode == "native" else compat_edits
    edits = build(script, opts, tree.line)
    output = edits.apply(script.module, tree.parent).code if edits else source
    findings = sorted(script.findings, key=lambda f: (f.line, f.kind != "manual"))
    return CodemodResult(source, output, mode, findings)


def _swap_perforatedai_imports(module: cst.Module, tree: Tree) -> tuple[cst.Module, list[int]]:
    """``from perforatedai import X`` -> ``from perfora.compat import X``; changed lines."""
    lines: list[int] = []
    target = cst.parse_expression("perfora.compat")

    class Swap(cst.CSTTransformer):
        def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom
                             ) -> cst.ImportFrom:
            name = cst.Module([]).code_for_node(original.module) if original.module else ""
            if name == "perforatedai" and not original.relative:
                lines.append(tree.line(original))
                return updated.with_changes(module=target)
            return updated

    return module.visit(Swap()), lines
