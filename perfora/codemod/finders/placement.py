"""Where perfora's block goes: before the optimizer, the wrap and ``torch.compile(model)``,
after the model exists, without moving the optimizer above names it reads."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..findings import Finding
from ..syntax import assigned_names, dotted, param_names
from .optimizer import ModelSite, OptimizerSite
from .tree import Tree
from .wrap import Wrap


@dataclass(frozen=True)
class Placement:
    """The statement perfora's block is inserted before (None: nowhere), whether the
    optimizer can still be rebuilt there, and the findings."""

    insert_at: cst.BaseStatement | None
    keep_optimizer: bool
    findings: list[Finding]


def find_placement(tree: Tree, model: ModelSite, model_var: str, wrap: Wrap | None,
                   site: OptimizerSite | None) -> Placement:
    """The first of the optimizer (``model.anchor``), the wrap and ``torch.compile`` of
    ``model_var`` in the anchor's block, if ``model_var`` is bound above it."""
    anchor, scope = model.anchor, model.scope
    block = tree.block_of(anchor)
    first = anchor
    later = [wrap.stmt] if wrap is not None else []
    later += [tree.statement(c) for c in tree.calls
              if tree.canonical(c.func) == "torch.compile" and tree.scope(c) is scope
              and c.args and dotted(c.args[0].value) == model_var]
    for stmt in later:
        top = tree.top_in_block(stmt, block)
        if top is not None and tree.index_in_block(top) < tree.index_in_block(first):
            first = top
    # the model must exist before: assigned earlier in this block, or a parameter
    index = tree.index_in_block(first)
    before = list(block.body)[:index]
    if not any(model_var in assigned_names(st) for st in before) and \
            model_var not in param_names(scope):
        return Placement(None, False, [tree.manual(
            anchor, f"`{model_var}` is not created in the same block before the optimizer; "
            "convert the model by hand right after it is created")])
    # moving the optimizer up to `first` must not read names bound in between
    between = list(block.body)[index:tree.index_in_block(anchor)]
    late = set().union(*(assigned_names(st) for st in between)) if between else set()
    clash = sorted(site.used_names & late) if site is not None else []
    if clash:
        return Placement(first, False, [tree.manual(
            site.anchor, f"the optimizer must be built before the {wrap.kind} wrap (line "
            f"{tree.line(wrap.stmt)}), but its arguments use {', '.join(clash)}, set after "
            "that line; left as it is: move it by hand")])
    return Placement(first, True, [])
