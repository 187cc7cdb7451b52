"""Small questions about libcst nodes: dotted names, source text, names read and bound,
comments, and substituting a helper's parameters by a call's arguments."""

from __future__ import annotations

import libcst as cst


def dotted(node: cst.CSTNode | None) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def code(node: cst.CSTNode) -> str:
    """The source text of a node, as written."""
    return cst.Module([]).code_for_node(node)


def root_names(node: cst.CSTNode) -> set[str]:
    """Names an expression reads (not attribute names, not keyword names)."""
    names: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            names.add(node.value)

    node.visit(Visitor())
    return names


def inner_comments(stmt: cst.CSTNode) -> str | None:
    """The comments inside and after a statement (not above it), joined; None without."""
    found: list[str] = []

    class Visitor(cst.CSTVisitor):
        def visit_EmptyLine(self, node: cst.EmptyLine) -> bool:
            return False

        def visit_Comment(self, node: cst.Comment) -> None:
            found.append(node.value.lstrip("#").strip())

    stmt.visit(Visitor())
    return "# " + "; ".join(found) if found else None


def assigned_names(stmt: cst.CSTNode) -> set[str]:
    """Names a statement binds (assignment targets, for targets, with-as, defs, imports)."""
    names: set[str] = set()

    def targets(node: cst.CSTNode) -> None:
        if isinstance(node, cst.Name):
            names.add(node.value)
        elif isinstance(node, (cst.Tuple, cst.List)):
            for el in node.elements:
                targets(el.value)
        elif isinstance(node, cst.StarredElement):
            targets(node.value)

    class Visitor(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            targets(node.target)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            targets(node.target)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            targets(node.target)

        def visit_For(self, node: cst.For) -> None:
            targets(node.target)

        def visit_AsName(self, node: cst.AsName) -> None:
            targets(node.name)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            names.add(node.name.value)
            return False

    stmt.visit(Visitor())
    return names


def substitute(node: cst.CSTNode, subst: dict[str, cst.CSTNode]) -> cst.CSTNode:
    """Replace the names in ``subst`` (a helper's parameters) by the call's arguments."""
    if not subst:
        return node

    class Replace(cst.CSTTransformer):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            return False

        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute
                            ) -> cst.Attribute:
            return updated.with_changes(value=updated.value.visit(self))

        def visit_Arg(self, node: cst.Arg) -> bool:
            return False

        def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
            return updated.with_changes(value=updated.value.visit(self))

        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            return subst.get(original.value, updated)

    return node.visit(Replace())


def param_names(func: cst.FunctionDef | None) -> list[str]:
    """A function's plain parameter names, in order ([] for None: module level)."""
    return [p.name.value for p in func.params.params] if func is not None else []
