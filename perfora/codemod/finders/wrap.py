"""The DataParallel/DDP wrap of the model (``model = DDP(model, ...)``), in the model's scope."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..findings import Finding
from ..syntax import dotted
from .tree import Tree

WRAPPERS = {"torch.nn.DataParallel": "DataParallel",
            "torch.nn.parallel.DataParallel": "DataParallel",
            "torch.nn.parallel.data_parallel.DataParallel": "DataParallel",
            "torch.nn.parallel.DistributedDataParallel": "DistributedDataParallel",
            "torch.nn.parallel.distributed.DistributedDataParallel": "DistributedDataParallel"}


@dataclass(frozen=True)
class Wrap:
    """``W = DataParallel/DistributedDataParallel(X, ...)``."""

    stmt: cst.SimpleStatementLine
    call: cst.Call
    kind: str
    target: str


def find_wrap(tree: Tree, model_var: str, scope: cst.FunctionDef | None
              ) -> tuple[Wrap | None, str, list[Finding]]:
    """The first ``W = DDP(X, ...)`` of the model in ``scope``, the model's name (``X`` when
    the optimizer was built over the wrapper's parameters), and the findings."""
    wraps = []
    findings = []
    for c in tree.calls:
        kind = WRAPPERS.get(tree.canonical(c.func) or "")
        if kind is None or tree.scope(c) is not scope:
            continue
        stmt = tree.statement(c)
        target = None
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign) \
                and stmt.body[0].value is c:
            t = stmt.body[0].targets[0].target
            target = t.value if isinstance(t, cst.Name) else None
        first = c.args[0].value if c.args else None
        while isinstance(first, cst.Call) and isinstance(first.func, cst.Attribute):
            first = first.func.value  # DDP(model.to(device)) -> model
        inner = dotted(first)
        if target is None or model_var not in (inner, target) or inner is None \
                or "." in inner:
            findings.append(tree.manual(c, f"{kind}(...) here does not have the form `model = "
                                        f"{kind}(model, ...)`; left as it is"))
            continue
        if target == model_var and inner != model_var:
            model_var = inner  # optimizer over ddp_model.parameters(): grow `model`
        wraps.append(Wrap(stmt, c, kind, target))
    if len(wraps) > 1:
        findings.append(tree.manual(wraps[1].stmt, "several DataParallel/DDP wraps; only the "
                                    f"first (line {tree.line(wraps[0].stmt)}) is handled"))
    return (wraps[0] if wraps else None), model_var, findings
