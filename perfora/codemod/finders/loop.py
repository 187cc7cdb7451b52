"""The epoch loop: the outermost loop around a batch loop that calls ``loss.backward()``
(directly or through the script's own functions), in the function the model is built in."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ..findings import Finding
from ..syntax import dotted
from .batch import BatchSite
from .tree import Tree

BY_HAND = ("(native: decision = controller.step(score); compat: model, restructured, "
           "training_complete = GPA.pai_tracker.add_validation_score(score, model))")
"""How to report the score by hand, in either mode (ends the findings about loops)."""


@dataclass(frozen=True)
class Loop:
    """The epoch loop, the score reported once per epoch and what to remove from it."""

    node: cst.For | cst.While
    last: cst.BaseStatement
    score: str | None
    sched_steps: list[cst.BaseStatement] = field(default_factory=list)
    batch: BatchSite | None = None


@dataclass(frozen=True)
class EpochLoop:
    """The epoch loop (a multi-line one) and the ``backward()`` call its batches reach."""

    node: cst.For | cst.While
    backward: cst.Call


class _Backward:
    """Which ``backward()`` call a node reaches, following the script's own functions up to
    three calls deep (memoized: every loop of a large script is asked)."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.memo: dict[tuple[int, int], cst.Call | None] = {}

    def reached(self, node: cst.CSTNode, depth: int = 0) -> cst.Call | None:
        """The first ``x.backward()`` in ``node`` or in the functions it calls, or None."""
        key = (id(node), depth)
        if key not in self.memo:
            self.memo[key] = self._find(node, depth)
        return self.memo[key]

    def _find(self, node: cst.CSTNode, depth: int) -> cst.Call | None:
        calls = self.tree.calls_in(node, "backward")
        if calls:
            return calls[0]
        if depth > 2:
            return None
        for c in self.tree.local_calls(node):
            found = self.reached(self.tree.defs[dotted(c.func)], depth + 1)
            if found is not None:
                return found
        return None

    def is_epoch_loop(self, loop: cst.For | cst.While) -> bool:
        """A loop whose backward() runs inside another (batch) loop, here or in a helper."""
        backward = self.reached(loop)
        if backward is None:
            return False
        inner = self.tree.loop_around(backward)
        return inner is not None and inner is not loop


def find_epoch_loop(tree: Tree, scope: cst.FunctionDef | None,
                    insert_at: cst.BaseStatement) -> tuple[EpochLoop | None, list[Finding]]:
    """The one epoch loop in ``scope`` after ``insert_at``; else None and what to do by hand."""
    backward = _Backward(tree)
    candidates = [lp for lp in tree.loops if tree.scope(lp) is scope
                  and backward.reached(lp) is not None]
    ids = {id(lp) for lp in candidates}
    outer = [lp for lp in candidates if not any(id(a) in ids for a in tree.ancestors(lp))]
    elsewhere = None if outer else next(
        (lp for lp in tree.loops if tree.scope(lp) is not scope and backward.is_epoch_loop(lp)),
        None)
    if elsewhere is not None:
        return None, [tree.manual(
            elsewhere, f"the epoch loop is in `{tree.scope(elsewhere).name.value}()`, not where "
            f"the optimizer is built (line {tree.line(insert_at)}): left as it is. Pass the "
            "controller (native) or the optimizer arguments (compat) to it and report the "
            f"validation score at the end of each epoch by hand {BY_HAND}, then rebuild the "
            "optimizer when restructured")]
    if not outer:
        return None, [tree.manual(
            insert_at or 1, "no recognisable training loop (an epoch loop around a batch "
            "loop that calls loss.backward()): report the validation score once per epoch by "
            f"hand {BY_HAND} and rebuild the optimizer when restructured")]
    if len(outer) > 1:
        lines = ", ".join(str(tree.line(lp)) for lp in outer)
        return None, [tree.manual(
            outer[0], f"several training loops (lines {lines}); none was changed: report the "
            "validation score once per epoch in the one that grows the model, by hand")]
    loop = outer[0]
    if tree.line(loop) < tree.line(insert_at):
        return None, [tree.manual(loop, "the training loop starts before the optimizer is "
                                  "built; left as it is")]
    reached = backward.reached(loop)
    if tree.loop_around(reached) is loop:
        return None, [tree.manual(
            loop, "this loop trains batches but has no epoch loop around it (no recognisable "
            "epoch): left as it is. Report a validation score by hand at the end of each "
            "evaluation period (native: decision = controller.step(score), take "
            "decision.optimizer when decision.restructured, stop when decision.complete; "
            "compat: model, restructured, training_complete = GPA.pai_tracker."
            "add_validation_score(score, model))")]
    if not isinstance(loop.body, cst.IndentedBlock):
        return None, [tree.manual(loop, "one-line loop; report the validation score by hand")]
    return EpochLoop(loop, reached), []
