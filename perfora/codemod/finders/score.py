"""The validation score reported once per epoch: ``--score``, ReduceLROnPlateau's argument,
or the likeliest name assigned in the epoch loop's body (and whether it is minimized)."""

from __future__ import annotations

import re

import libcst as cst

from ..findings import Finding
from ..syntax import assigned_names, code, dotted
from .loop import BY_HAND
from .optimizer import OptimizerSite
from .tree import Tree

MINIMIZE = re.compile(r"loss|err|mse|mae|rmse|nll|perplex|ppl|cost", re.I)
METRIC = re.compile(r"acc|loss|score|metric|f1|auc|err|mse|mae|rmse|ppl|perplex|prec|recall|iou"
                    r"|map|bleu|r2", re.I)
VALIDATION = re.compile(r"val|valid|dev|eval|holdout", re.I)
TEST = re.compile(r"test", re.I)


def find_score(tree: Tree, loop: cst.For | cst.While, site: OptimizerSite | None,
               wanted: str | None) -> tuple[str | None, list[Finding]]:
    """The score's name (``wanted``: the user's --score), or None and what to do by hand."""
    name, findings = _score(tree, loop, site, wanted)
    if name is None:
        findings.append(tree.manual(
            loop, "no validation score found in this epoch loop (a name like val_acc, "
            "val_loss, valid_score assigned in its body): the loop was left as it is. Compute "
            "one every epoch and pass --score NAME, or report it by hand at the end of the "
            f"epoch {BY_HAND}"))
    return name, findings


def _score(tree: Tree, loop: cst.For | cst.While, site: OptimizerSite | None,
           wanted: str | None) -> tuple[str | None, list[Finding]]:
    """:func:`find_score` before the finding that no score was found."""
    assigned: list[str] = []
    for stmt in loop.body.body:
        if isinstance(stmt, (cst.SimpleStatementLine, cst.With)):
            text = code(stmt)
            for name in sorted(assigned_names(stmt), key=text.find):
                if name not in assigned:
                    assigned.append(name)
    if wanted is not None:
        if wanted not in assigned:
            return None, [tree.manual(loop, f"--score {wanted}: not assigned in the body of "
                                      "this epoch loop")]
        return wanted, []
    if site is not None and site.sched_var:
        for c in tree.calls_in(loop, "step"):
            if dotted(c.func.value) == site.sched_var and c.args \
                    and isinstance(c.args[0].value, cst.Name) \
                    and c.args[0].value.value in assigned:
                return c.args[0].value.value, []
    ranked = [n for n in assigned if VALIDATION.search(n) and METRIC.search(n)] + \
             [n for n in assigned if TEST.search(n) and METRIC.search(n)] + \
             [n for n in assigned if METRIC.search(n) and "train" not in n.lower()]
    if not ranked:
        return None, []
    return ranked[0], [tree.note(
        loop, f"reporting `{ranked[0]}` as the validation score "
        f"({'minimized' if MINIMIZE.search(ranked[0]) else 'maximized'}); --score NAME and "
        "--maximize/--minimize choose otherwise")]
