"""A parsed script the finders share: where each node is (parents, scope, block, line) and
which calls it holds, answered from one pass over the tree and cached."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ..findings import MANUAL, NOTE, Finding
from ..syntax import assigned_names, code, dotted
from .collect import Collector

LOOP_TYPES = (cst.For, cst.While)
LOCAL = "<local>"
"""``Tree.calls_in`` key for calls of the script's own (module- or function-level) defs."""
GUARD_TYPES = (cst.If, cst.Try, cst.Else, cst.ExceptHandler, cst.Finally, cst.For, cst.While,
               cst.IfExp)


class Tree:
    """A script's libcst module with the lookups every finder needs (read-only)."""

    def __init__(self, source: str) -> None:
        """Parse ``source`` (raises ``libcst.ParserSyntaxError``) and index it once."""
        self.module = cst.parse_module(source)
        collected = Collector()
        self.module.visit(collected)
        self.parents = collected.parents
        self.calls = collected.calls
        self.attr_calls = collected.attr_calls
        self.defs = collected.defs
        self.loops = collected.loops
        self.aliases = collected.aliases
        self.names = collected.names
        self._top_lines: dict[int, int] | None = None  # id(top statement) -> lines above it
        self._positions: dict[int, Any] = {}  # id(top statement) -> its nodes' positions
        self._calls_index: dict[str, dict[int, list[cst.Call]]] = {}
        self._module_level_names: set[str] | None = None

    # ----------------------------------------------------------------- lines, findings
    def line(self, node: cst.CSTNode) -> int:
        """The 1-based line a node starts on.

        Positions are computed only for the module-level statement holding the node (libcst's
        PositionProvider over that one statement), offset by the lines above it: resolving
        them for the whole module cost most of the analysis of a large script.
        """
        top = node
        for anc in self.ancestors(node):
            if isinstance(anc, cst.Module):
                break
            top = anc
        if top is self.module:
            return 1
        if self._top_lines is None:
            above = sum(self.module.code_for_node(line).count("\n")
                        for line in self.module.header)
            self._top_lines = {}
            for stmt in self.module.body:
                self._top_lines[id(stmt)] = above
                above += self.module.code_for_node(stmt).count("\n")
        positions = self._positions.get(id(top))
        if positions is None:
            alone = self.module.with_changes(body=[top], header=[], footer=[])
            wrapper = MetadataWrapper(alone, unsafe_skip_copy=True)
            positions = self._positions[id(top)] = wrapper.resolve(PositionProvider)
        return self._top_lines[id(top)] + positions[node].start.line

    def manual(self, node: cst.CSTNode | int, message: str) -> Finding:
        """Something the user must do by hand, at a node's line (or a line number)."""
        return Finding(node if isinstance(node, int) else self.line(node), message, MANUAL)

    def note(self, node: cst.CSTNode | int, message: str) -> Finding:
        """What the conversion did, at a node's line (or a line number)."""
        return Finding(node if isinstance(node, int) else self.line(node), message, NOTE)

    # ---------------------------------------------------------------------- names
    def canonical(self, node: cst.CSTNode) -> str | None:
        """The dotted name with import aliases resolved (``DDP`` -> ``torch.nn...``)."""
        name = dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        full = self.aliases.get(head, head)
        return f"{full}.{rest}" if rest else full

    def module_level_names(self) -> set[str]:
        """Names bound by module-level statements other than function and class definitions."""
        if self._module_level_names is None:
            self._module_level_names = set().union(*(
                assigned_names(st) for st in self.module.body
                if not isinstance(st, (cst.FunctionDef, cst.ClassDef))))
        return self._module_level_names

    # ------------------------------------------------------------------ navigation
    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The node's parent (None for the module)."""
        return self.parents.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Parents, nearest first."""
        node = self.parent(node)
        while node is not None:
            yield node
            node = self.parent(node)

    def inside(self, node: cst.CSTNode | None, outer: cst.CSTNode | None) -> bool:
        """``node`` is ``outer`` (None too: module level) or nested in it."""
        return node is outer or (node is not None
                                 and any(a is outer for a in self.ancestors(node)))

    def statement(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The statement (a member of an IndentedBlock or the Module body) holding node."""
        while True:
            parent = self.parent(node)
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                return node
            node = parent

    def scope(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The function a node is in (None: module level)."""
        for anc in self.ancestors(node):
            if isinstance(anc, cst.FunctionDef):
                return anc
        return None

    def loop_around(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        """The innermost loop holding ``node`` (None outside loops)."""
        return next((a for a in self.ancestors(node) if isinstance(a, LOOP_TYPES)), None)

    def block_of(self, stmt: cst.CSTNode) -> cst.IndentedBlock | cst.Module:
        """The block whose body holds a statement."""
        return self.parent(stmt)

    def top_in_block(self, node: cst.CSTNode, block: cst.CSTNode) -> cst.CSTNode | None:
        """The statement of ``block`` that contains ``node`` (None if outside it)."""
        prev = node
        for anc in self.ancestors(node):
            if anc is block:
                return prev
            prev = anc
        return None

    def index_in_block(self, stmt: cst.CSTNode) -> int:
        """A statement's position in its block."""
        return list(self.block_of(stmt).body).index(stmt)

    @staticmethod
    def is_main_guard(node: cst.CSTNode) -> bool:
        """``if __name__ == "__main__":`` (not a condition for the converter)."""
        return isinstance(node, cst.If) and "__name__" in code(node.test) \
            and "__main__" in code(node.test)

    def guards(self, node: cst.CSTNode, scope: cst.FunctionDef | None) -> list[cst.CSTNode]:
        """If/Try/loop/Else nodes between node and its scope (the __main__ guard excluded)."""
        found = []
        for anc in self.ancestors(node):
            if anc is scope:
                break
            if isinstance(anc, GUARD_TYPES) and not self.is_main_guard(anc):
                found.append(anc)
        return found

    # ----------------------------------------------------------------------- calls
    def calls_in(self, node: cst.CSTNode, attr: str) -> list[cst.Call]:
        """Calls ``<x>.attr(...)`` (``attr=LOCAL``: calls of the script's own functions)
        inside ``node``, not inside function definitions nested in it, in source order.

        Answered from an index built once per ``attr`` (each call walks its ancestors up to
        its function), so asking for every loop of a large script stays linear.
        """
        index = self._calls_index.get(attr)
        if index is None:
            index = self._calls_index[attr] = {}
            if attr == LOCAL:
                calls = [c for c in self.calls
                         if isinstance(c.func, cst.Name) and c.func.value in self.defs]
            else:
                calls = self.attr_calls.get(attr, [])
            for call in calls:
                prev: cst.CSTNode = call
                for anc in self.ancestors(call):
                    if isinstance(anc, cst.FunctionDef):
                        if prev is anc.body:  # not its decorators or default values
                            index.setdefault(id(anc), []).append(call)
                        break
                    index.setdefault(id(anc), []).append(call)
                    prev = anc
        return index.get(id(node), [])

    def local_calls(self, node: cst.CSTNode) -> list[cst.Call]:
        """Calls of the script's own functions inside ``node`` (not in nested defs)."""
        return self.calls_in(node, LOCAL)

    def calls_of(self, func: cst.FunctionDef) -> list[cst.Call]:
        """Every call of ``func`` by its plain name, in source order."""
        return [c for c in self.calls if dotted(c.func) == func.name.value]
