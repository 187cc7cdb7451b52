"""One pass over a script's syntax tree: every node's parent, call, def, loop and import alias.

The finders answer "which calls are inside this node" from these lists and the parents
(:meth:`~perfora.codemod.finders.tree.Tree.calls_in`) instead of visiting subtrees again,
which keeps large scripts converting in linear time.
"""

from __future__ import annotations

import libcst as cst

from ..syntax import dotted


class Collector(cst.CSTVisitor):
    """Records, in source order, what the finders look up (filled by ``module.visit``)."""

    def __init__(self) -> None:
        self.parents: dict[int, cst.CSTNode] = {}   # id(node) -> its parent
        self._stack: list[cst.CSTNode] = []
        self.calls: list[cst.Call] = []
        self.attr_calls: dict[str, list[cst.Call]] = {}  # "step" -> every x.step(...) call
        self.defs: dict[str, cst.FunctionDef] = {}
        self.loops: list[cst.For | cst.While] = []
        self.aliases: dict[str, str] = {}
        self.names: set[str] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        """Record the node's parent, then dispatch to ``visit_<Type>``."""
        if self._stack:
            self.parents[id(node)] = self._stack[-1]
        self._stack.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        """Dispatch to ``leave_<Type>``, then step back to the parent."""
        super().on_leave(original_node)
        self._stack.pop()

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)
        if isinstance(node.func, cst.Attribute):
            self.attr_calls.setdefault(node.func.attr.value, []).append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.defs.setdefault(node.name.value, node)

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)

    def visit_While(self, node: cst.While) -> None:
        self.loops.append(node)

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted(alias.name)
            if full is None:
                continue
            if alias.asname is not None:
                self.aliases[alias.asname.name.value] = full
            else:
                self.aliases.setdefault(full.split(".")[0], full.split(".")[0])

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        base = dotted(node.module) if node.module is not None else None
        if base is None or node.relative or isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            name = dotted(alias.name)
            local = alias.asname.name.value if alias.asname is not None else name
            self.aliases[local] = f"{base}.{name}"
