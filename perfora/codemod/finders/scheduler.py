"""The LR scheduler built over the optimizer: its class, arguments and ReduceLROnPlateau mode."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..findings import Finding
from ..syntax import code, root_names, substitute
from .calls import assigned_name, split_args
from .tree import Tree


@dataclass(frozen=True)
class Scheduler:
    """``var = <cls>(optimizer, **kwargs)``, the arguments as written (helper's replaced)."""

    stmt: cst.BaseStatement
    var: str | None
    cls: str
    kwargs: list[tuple[str, str]]
    used_names: set[str]
    plateau_mode: str | None


def is_scheduler(tree: Tree, call: cst.Call) -> bool:
    """``torch.optim.lr_scheduler.<Class>(...)``."""
    name = tree.canonical(call.func) or ""
    return name.startswith("torch.optim.lr_scheduler.") and \
        name.rsplit(".", 1)[-1][:1].isupper()


def find_scheduler(tree: Tree, func: cst.FunctionDef | None, opt_var: str,
                   subst: dict[str, cst.CSTNode]) -> tuple[Scheduler | None, list[Finding]]:
    """The scheduler over ``opt_var`` in ``func`` (None: there is none).

    Findings mean it is irregular (built twice, conditionally, unmappable arguments, not
    assigned): then the optimizer is left as it is too. ``subst`` maps an inlined helper's
    parameters to the call's arguments.
    """
    scheds = [c for c in tree.calls if is_scheduler(tree, c) and tree.scope(c) is func]
    mine = []
    for c in scheds:
        head, kwargs = split_args(tree, c, "optimizer")
        if isinstance(head, cst.Name) and head.value == opt_var:
            mine.append((c, kwargs))
    if not mine:
        return None, []
    if len(mine) > 1 or tree.guards(mine[0][0], func) or mine[0][1] is None:
        return None, [tree.manual(mine[0][0], "the LR scheduler is built more than once, "
                                  "conditionally, or with arguments that could not be mapped: "
                                  "the optimizer and scheduler were left as they are; register "
                                  "them by hand")]
    call, kwargs = mine[0]
    stmt = tree.statement(call)
    var = assigned_name(stmt, call)
    if var is None and not subst:
        return None, [tree.manual(call, "the LR scheduler is not assigned to one name; left "
                                  "as it is")]
    kwargs = [(k, substitute(v, subst)) for k, v in kwargs]
    plateau_mode = None
    if (tree.canonical(call.func) or "").endswith("ReduceLROnPlateau"):
        mode = dict(kwargs).get("mode")
        plateau_mode = mode.evaluated_value if isinstance(
            mode, cst.SimpleString) else "min" if mode is None else None
    used = set().union(*(root_names(v) for _, v in kwargs)) if kwargs else set()
    return Scheduler(stmt, var, code(call.func), [(k, code(v)) for k, v in kwargs], used,
                     plateau_mode), []
