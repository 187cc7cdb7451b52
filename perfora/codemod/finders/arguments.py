"""The script's argparse: where new flags go, the name the parsed arguments get, and whether
that name is visible where perfora's block is inserted."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ..findings import Finding
from ..syntax import assigned_names, dotted, param_names
from .tree import Tree


@dataclass(frozen=True)
class ArgParse:
    """The user's argparse: where to add flags and the name the parsed arguments get."""

    parse_stmt: cst.BaseStatement | None
    parser_var: str | None
    args_var: str | None
    existing_flags: set[str] = field(default_factory=set)


def find_argparse(tree: Tree) -> tuple[ArgParse | None, list[Finding]]:
    """The first ``argparse.ArgumentParser()`` and its one ``parse_args()``; None without."""
    parsers = [c for c in tree.calls if tree.canonical(c.func) == "argparse.ArgumentParser"]
    if not parsers:
        return None, []
    call = parsers[0]
    stmt = tree.statement(call)
    parser_var = None
    if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign) \
            and isinstance(stmt.body[0].targets[0].target, cst.Name):
        parser_var = stmt.body[0].targets[0].target.value
    flags = set()
    for c in tree.attr_calls.get("add_argument", []):
        for arg in c.args:
            if isinstance(arg.value, cst.SimpleString) and arg.keyword is None:
                flags.add(arg.value.evaluated_value)
    parse_calls = [c for c in tree.attr_calls.get("parse_args", [])
                   + tree.attr_calls.get("parse_known_args", [])
                   if parser_var and dotted(c.func.value) == parser_var]
    if len(parse_calls) != 1:
        return ArgParse(None, parser_var, None, flags), [tree.manual(
            call, "argparse: found the parser but not one "
            f"`{parser_var or 'parser'}.parse_args()` call; add the flags by hand")]
    parse = parse_calls[0]
    pstmt = tree.statement(parse)
    args_var = _parsed_name(tree, pstmt)
    findings = [] if args_var is not None else [tree.manual(
        parse, "argparse: could not tell which name holds the parsed arguments; add the "
        "flags by hand")]
    return ArgParse(pstmt, parser_var, args_var, flags), findings


def _parsed_name(tree: Tree, pstmt: cst.BaseStatement) -> str | None:
    """``args = parser.parse_args()``, or the name a function returning it is assigned to."""
    args_var = None
    small = pstmt.body[0] if isinstance(pstmt, cst.SimpleStatementLine) else None
    if isinstance(small, cst.Assign):
        target = small.targets[0].target
        if isinstance(target, cst.Tuple):
            target = target.elements[0].value
        if isinstance(target, cst.Name):
            args_var = target.value
    elif isinstance(small, cst.Return):
        func = tree.scope(pstmt)
        if func is not None:
            for site in tree.calls_of(func):
                st = tree.statement(site)
                if isinstance(st, cst.SimpleStatementLine) and isinstance(st.body[0],
                                                                          cst.Assign):
                    target = st.body[0].targets[0].target
                    if isinstance(target, cst.Name):
                        args_var = target.value
    return args_var


def args_visible(tree: Tree, ap: ArgParse | None, scope: cst.FunctionDef | None,
                 insert_at: cst.BaseStatement | None) -> tuple[bool, list[Finding]]:
    """Whether perfora's block at ``insert_at`` can read the parsed arguments.

    A parser perfora adds itself (no argparse) is module-level, so visible everywhere.
    """
    if ap is None or ap.args_var is None or insert_at is None:
        return ap is None, []
    module_level = ap.args_var in tree.module_level_names()
    local = scope is not None and any(
        ap.args_var in assigned_names(st) for st in scope.body.body
        if not isinstance(st, (cst.FunctionDef, cst.ClassDef)))
    visible = module_level or local or ap.args_var in param_names(scope)
    if visible:
        return True, []
    return False, [tree.manual(insert_at, f"`{ap.args_var}` (the parsed arguments) is not "
                               "visible here: the resume/initialization flags were not used; "
                               "pass the arguments to this function and rerun perfora "
                               "convert")]


def args_name_in(tree: Tree, ap: ArgParse | None, func: cst.FunctionDef | None,
                 scope: cst.FunctionDef | None) -> str | None:
    """The parsed arguments' name where ``func`` (the batch's function) can read it, or None.

    Module-level, a parameter of ``func``, or ``func`` within the optimizer's ``scope``.
    """
    if ap is None or ap.args_var is None:
        return None
    module_level = ap.args_var in tree.module_level_names()
    if module_level or ap.args_var in param_names(func) or tree.inside(func, scope):
        return ap.args_var
    return None
