"""The script's imports: whether it already uses perfora (or PerforatedAI), and the last
import statement at its top, after which perfora's imports go."""

from __future__ import annotations

import libcst as cst

from .tree import Tree


def already_converted(tree: Tree) -> str | None:
    """``native`` (perfora.perforate / GrowthController called), ``compat``
    (PerforatedAI's perforate_model / initialize_pai), or None."""
    for call in tree.calls:
        name = tree.canonical(call.func) or ""
        if name in ("perfora.perforate", "perfora.GrowthController"):
            return "native"
        if name.endswith("utils_perforatedai.perforate_model") or \
                name.endswith("utils_perforatedai.initialize_pai"):
            return "compat"
    return None


def last_import(module: cst.Module) -> cst.BaseStatement | None:
    """The last import line before the first definition or compound statement after it."""
    last = None
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
            last = stmt
        elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or (
                isinstance(stmt, cst.BaseCompoundStatement) and last is not None):
            break
    return last
