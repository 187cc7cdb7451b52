"""Where one batch is trained: the statements holding ``zero_grad()`` and ``backward()``, and
the names the model and the parsed arguments have there (compat mode edits around them)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..syntax import dotted, param_names
from .arguments import ArgParse, args_name_in
from .tree import Tree
from .wrap import Wrap


@dataclass(frozen=True)
class BatchSite:
    """Where one batch is trained: the statements holding zero_grad() and backward()."""

    zero_grad: cst.BaseStatement | None
    backward: cst.BaseStatement
    scope: cst.FunctionDef | None
    model_name: str | None
    args_name: str | None


def find_batch(tree: Tree, backward: cst.Call, loop: cst.For | cst.While,
               scope: cst.FunctionDef | None, model_var: str, wrap: Wrap | None,
               argparse: ArgParse | None) -> BatchSite:
    """The batch around ``backward`` (reached from the epoch ``loop``; ``scope``: the
    model's function): the last zero_grad() before it in its block, and the model's name."""
    bstmt = tree.statement(backward)
    body = list(tree.block_of(bstmt).body)
    zero = None
    for st in body[:body.index(bstmt)]:
        if tree.calls_in(st, "zero_grad"):
            zero = st
    func = tree.scope(bstmt)
    model_name = None
    if tree.inside(func, scope):
        model_name = model_var
    elif func is not None:
        # a helper called from the loop: which parameter gets the model?
        params = param_names(func)
        for c in tree.local_calls(loop):
            if dotted(c.func) != func.name.value:
                continue
            for i, arg in enumerate(c.args):
                if dotted(arg.value) in (model_var, wrap.target if wrap else None):
                    if arg.keyword is not None:
                        model_name = arg.keyword.value
                    elif i < len(params):
                        model_name = params[i]
    return BatchSite(zero, bstmt, func, model_name,
                     args_name_in(tree, argparse, func, scope))
