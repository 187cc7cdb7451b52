"""Statement-level edits on a libcst tree: insert before/after, replace, remove.

Edits are keyed by the original statement nodes the analysis found, applied in one pass;
everything not edited (comments, blank lines, formatting) is kept byte for byte.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Callable

import libcst as cst


def statements(text: str) -> list[cst.BaseStatement]:
    """Parse statements from dedented text; leading comments stay with their statement."""
    body = textwrap.indent(textwrap.dedent(text).strip("\n") + "\n", "    ")
    return list(cst.parse_statement("if True:\n" + body).body.body)


def with_blank_line(stmts: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The same statements, the first one preceded by one empty line."""
    if not stmts:
        return stmts
    first = stmts[0]
    return [first.with_changes(leading_lines=[cst.EmptyLine(indent=False), *first.leading_lines]),
            *stmts[1:]]


class Edits:
    """A set of statement edits, applied together by :meth:`apply`."""

    def __init__(self) -> None:
        self.before: dict[int, list[cst.BaseStatement]] = defaultdict(list)
        self.after: dict[int, list[cst.BaseStatement]] = defaultdict(list)
        self.replace: dict[int, list[cst.BaseStatement]] = {}
        self.drop_comments: set[int] = set()
        self.targets: dict[int, cst.CSTNode] = {}  # the edited statements, by id

    def insert_before(self, stmt: cst.CSTNode, new: list[cst.BaseStatement]) -> None:
        """Put ``new`` just above ``stmt`` (after what earlier calls put there)."""
        self.targets[id(stmt)] = stmt
        self.before[id(stmt)].extend(new)

    def insert_after(self, stmt: cst.CSTNode, new: list[cst.BaseStatement]) -> None:
        """Put ``new`` just below ``stmt`` (after what earlier calls put there)."""
        self.targets[id(stmt)] = stmt
        self.after[id(stmt)].extend(new)

    def replace_with(self, stmt: cst.CSTNode, new: list[cst.BaseStatement]) -> None:
        """Replace ``stmt`` by ``new``; the comments above it stay above the first one."""
        self.targets[id(stmt)] = stmt
        self.replace[id(stmt)] = list(new)

    def remove(self, stmt: cst.CSTNode, keep_comments: bool = True) -> None:
        """Remove a statement; its comments move to the next one unless ``keep_comments``
        is False (the caller put them elsewhere)."""
        self.targets[id(stmt)] = stmt
        self.replace[id(stmt)] = []
        if not keep_comments:
            self.drop_comments.add(id(stmt))

    def __bool__(self) -> bool:
        return bool(self.before or self.after or self.replace)

    def apply(self, module: cst.Module,
              parent: Callable[[cst.CSTNode], cst.CSTNode | None] | None = None) -> cst.Module:
        """The edited module (``module`` must be the tree the statements came from).

        With ``parent`` (a node's parent in ``module``), only the blocks on the way to the
        edited statements are visited and rebuilt, not the whole tree.
        """
        within = None
        if parent is not None:
            within = set()
            for node in self.targets.values():
                anc = parent(node)
                while anc is not None and id(anc) not in within:
                    within.add(id(anc))
                    anc = parent(anc)
        return module.visit(_Apply(self, within))


class _Apply(cst.CSTTransformer):
    def __init__(self, edits: Edits, within: set[int] | None = None) -> None:
        self.edits = edits
        self.within = within

    def on_visit(self, node: cst.CSTNode) -> bool:
        """Descend only towards the edited statements (everywhere without ``within``)."""
        return (self.within is None or id(node) in self.within) and super().on_visit(node)

    def _body(self, original: list[cst.CSTNode], updated: list[cst.CSTNode]) -> list:
        out: list[cst.CSTNode] = []
        carry: list[cst.EmptyLine] = []  # comments of a removed statement move down
        for orig, upd in zip(original, updated):
            new = list(self.edits.before.get(id(orig), []))
            if id(orig) in self.edits.replace:
                replacement = list(self.edits.replace[id(orig)])
                if replacement:
                    first = replacement[0]
                    replacement[0] = first.with_changes(
                        leading_lines=[*upd.leading_lines, *first.leading_lines])
                else:
                    carry.extend(upd.leading_lines)
                    if id(orig) not in self.edits.drop_comments:
                        carry.extend(_inner_comments(upd))
                new.extend(replacement)
            else:
                new.append(upd)
            new.extend(self.edits.after.get(id(orig), []))
            if carry and new:
                new[0] = new[0].with_changes(leading_lines=[*carry, *new[0].leading_lines])
                carry = []
            out.extend(new)
        return out

    def leave_IndentedBlock(self, original: cst.IndentedBlock,
                            updated: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._body(list(original.body), list(updated.body))
        if not body:
            body = [cst.SimpleStatementLine([cst.Pass()])]
        return updated.with_changes(body=body)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._body(list(original.body), list(updated.body)))


def _inner_comments(stmt: cst.CSTNode) -> list[cst.EmptyLine]:
    """The comments inside and after a removed statement, as comment lines to keep."""
    found: list[cst.EmptyLine] = []

    class Visitor(cst.CSTVisitor):
        def visit_EmptyLine(self, node: cst.EmptyLine) -> bool:
            return False  # leading lines: kept by the caller

        def visit_Comment(self, node: cst.Comment) -> None:
            found.append(cst.EmptyLine(comment=node))

    stmt.visit(Visitor())
    return found
