"""A constructor call's arguments by keyword, and the one name its result is assigned to."""

from __future__ import annotations

import importlib
import inspect

import libcst as cst

from .tree import Tree

Kwargs = list[tuple[str, cst.CSTNode]]
"""A call's arguments after the first, as (keyword, expression), in the order written."""


def signature_names(tree: Tree, call: cst.Call) -> list[str] | None:
    """The parameter names of the called class (imported to read them); None if unknown."""
    name = tree.canonical(call.func) or ""
    try:
        module, _, cls = name.rpartition(".")
        obj = getattr(importlib.import_module(module), cls)
        return [p for p in inspect.signature(obj).parameters if p != "self"]
    except (ImportError, AttributeError, ValueError, TypeError):
        return None


def split_args(tree: Tree, call: cst.Call, first: str
               ) -> tuple[cst.CSTNode | None, Kwargs | None]:
    """(the first argument, named ``first``; the rest by keyword); rest None if unmappable.

    Positional arguments after the first get their names from the class's signature, so
    the converted script passes them as keywords (``SGD(p, 0.1)`` -> ``lr=0.1``).
    """
    head = None
    rest: Kwargs = []
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if any(a.star for a in call.args):
        return None, None
    names = None
    for i, arg in enumerate(positional):
        if i == 0:
            head = arg.value
            continue
        if names is None:
            names = signature_names(tree, call)
            if names is None:
                return head, None
        rest.append((names[i], arg.value))
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value == first:
                head = arg.value
            else:
                rest.append((arg.keyword.value, arg.value))
    return head, rest


def assigned_name(stmt: cst.CSTNode, call: cst.Call) -> str | None:
    """``name`` when ``stmt`` is exactly ``name = <call>``, else None."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
            and isinstance(stmt.body[0], cst.Assign) and stmt.body[0].value is call \
            and len(stmt.body[0].targets) == 1 \
            and isinstance(stmt.body[0].targets[0].target, cst.Name):
        return stmt.body[0].targets[0].target.value
    return None


def parameters_of(node: cst.CSTNode | None) -> str | None:
    """``x`` for the expression ``x.parameters()``, else None."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
            and node.func.attr.value == "parameters" and not node.args \
            and isinstance(node.func.value, cst.Name):
        return node.func.value.value
    return None
