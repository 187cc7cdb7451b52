"""The scheduler's ``step()`` calls in the epoch loop (and in the helpers it passes the
scheduler to): removed when once per epoch, a reason to leave the optimizer when per batch."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..findings import Finding
from ..syntax import dotted, param_names
from .optimizer import OptimizerSite
from .tree import Tree


@dataclass(frozen=True)
class SchedulerSteps:
    """The once-per-epoch step statements to remove; ``per_batch``: stepped every batch."""

    remove: list[cst.BaseStatement]
    per_batch: bool
    findings: list[Finding]


def find_scheduler_steps(tree: Tree, loop: cst.For | cst.While, backward: cst.Call,
                         site: OptimizerSite) -> SchedulerSteps:
    """``sched.step(...)`` in ``loop``, under its name there or as a helper's parameter."""
    if site.sched_var is None:
        return SchedulerSteps([], False, [])
    batch_loop = tree.loop_around(backward)
    names: dict[str, cst.CSTNode] = {site.sched_var: loop}
    for c in tree.local_calls(loop):  # helpers that receive the scheduler
        func = tree.defs[dotted(c.func)]
        params = param_names(func)
        for i, arg in enumerate(c.args):
            if dotted(arg.value) == site.sched_var:
                name = arg.keyword.value if arg.keyword else params[i] if i < len(
                    params) else None
                if name:
                    names[name] = func
    found = []
    findings = []
    per_batch = False
    for name, where in names.items():
        for c in tree.calls_in(where, "step"):
            if dotted(c.func.value) != name:
                continue
            stmt = tree.statement(c)
            if batch_loop is not None and tree.inside(c, batch_loop):
                findings.append(tree.manual(
                    c, f"`{name}.step()` runs every batch, but perfora steps the scheduler it "
                    "rebuilds once per epoch: the optimizer and scheduler (line "
                    f"{tree.line(site.anchor)}) were left as they are. Keep stepping it "
                    "yourself: build the optimizer and scheduler again over model.parameters() "
                    "after every restructure (native: ctl.set_optimizer_instance(optimizer))"))
                per_batch = True
                continue
            if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
                    and isinstance(stmt.body[0], cst.Expr):
                found.append(stmt)
    return SchedulerSteps(found, per_batch, findings)
