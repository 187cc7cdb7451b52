"""An optimizer built in a helper (``opt, sched = make_optimizer(model, lr)``): the one call
site, its arguments by parameter, and the names the results get there, so the recipe can be
inlined at the call."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..findings import Finding
from ..syntax import dotted
from .calls import assigned_name
from .tree import Tree


@dataclass(frozen=True)
class HelperCall:
    """Where the helper is called and what its optimizer and scheduler are called there."""

    call: cst.Call                      # the call of the helper
    stmt: cst.BaseStatement             # ``opt, sched = helper(...)``
    scope: cst.FunctionDef | None       # the function the call is in
    subst: dict[str, cst.CSTNode]       # the helper's parameters -> the call's arguments
    model_var: str                      # the model's name at the call
    opt_var: str
    sched_var: str | None
    local_opt: str | None               # the optimizer's name inside the helper


def read_helper(tree: Tree, call: cst.Call, helper: cst.FunctionDef, model_param: str
                ) -> tuple[HelperCall | None, list[Finding]]:
    """The helper's one unconditional call site, if the helper only builds and returns the
    optimizer (and scheduler); else None and why (``call``: the optimizer in the helper)."""
    name = helper.name.value
    sites = tree.calls_of(helper)
    if len(sites) != 1:
        return None, [tree.manual(helper, f"the optimizer is built in `{name}()`, which is "
                                  f"called {len(sites)} times; left as it is: register it by "
                                  "hand")]
    site_call = sites[0]
    site_stmt = tree.statement(site_call)
    outer = tree.scope(site_call)
    if tree.guards(site_call, outer):
        return None, [tree.manual(site_call, f"`{name}()` is called conditionally; left as "
                                  "it is: register the optimizer by hand")]
    subst = _substitutions(site_call, helper)
    if subst is None:
        return None, [tree.manual(site_call, "could not map the call's arguments to "
                                  f"`{name}()`'s parameters; register the optimizer by hand")]
    model_arg = subst.get(model_param)
    if not isinstance(model_arg, cst.Name):
        return None, [tree.manual(site_call, "the model passed to the optimizer helper is not "
                                  "a plain name; register the optimizer by hand")]
    # the helper must only build and return them
    body = [s for s in helper.body.body
            if not (isinstance(s, cst.SimpleStatementLine)
                    and isinstance(s.body[0], cst.Expr)
                    and isinstance(s.body[0].value, cst.SimpleString))]
    allowed = True
    for s in body:
        if not isinstance(s, cst.SimpleStatementLine) or len(s.body) != 1 \
                or not isinstance(s.body[0], (cst.Assign, cst.Return)):
            allowed = False
    local_opt = assigned_name(tree.statement(call), call)
    if not allowed or not isinstance(body[-1].body[0], cst.Return):
        return None, [tree.manual(helper, f"`{name}()` does more than build and return the "
                                  "optimizer/scheduler; left as it is: register them by hand")]
    if not isinstance(site_stmt, cst.SimpleStatementLine) or \
            not isinstance(site_stmt.body[0], cst.Assign):
        return None, [tree.manual(site_call, "the optimizer helper's result is not assigned; "
                                  "register the optimizer by hand")]
    target = site_stmt.body[0].targets[0].target
    names = [e.value.value for e in target.elements] if isinstance(target, cst.Tuple) \
        and all(isinstance(e.value, cst.Name) for e in target.elements) else \
        [target.value] if isinstance(target, cst.Name) else None
    returned = body[-1].body[0].value
    ret = [dotted(e.value) for e in returned.elements] if isinstance(returned, cst.Tuple) \
        else [dotted(returned) if returned is not call else local_opt or "<opt>"]
    if names is None or len(names) != len(ret):
        return None, [tree.manual(site_call, "could not match the helper's return value to "
                                  "the names assigned here; register the optimizer by hand")]
    by_local = dict(zip(ret, names))
    opt_local = local_opt if local_opt is not None else "<opt>"
    opt_var = by_local.get(opt_local)
    if returned is call:
        opt_var = names[0]
    if opt_var is None:
        return None, [tree.manual(site_call, "the helper does not return its optimizer; "
                                  "register it by hand")]
    sched_local = next((r for r in ret if r not in (opt_local,)), None)
    sched_var = by_local[sched_local] if sched_local is not None else None
    return HelperCall(site_call, site_stmt, outer, subst, model_arg.value, opt_var, sched_var,
                      local_opt), []


def _substitutions(site_call: cst.Call, helper: cst.FunctionDef
                   ) -> dict[str, cst.CSTNode] | None:
    """The helper's parameters -> the call's arguments (or defaults); None if unmappable."""
    subst: dict[str, cst.CSTNode] = {}
    params = list(helper.params.params)
    positional = [a for a in site_call.args if a.keyword is None]
    if any(a.star for a in site_call.args) or len(positional) > len(params):
        return None
    for param, arg in zip(params, positional):
        subst[param.name.value] = arg.value
    for arg in site_call.args:
        if arg.keyword is not None:
            subst[arg.keyword.value] = arg.value
    for param in params:
        if param.name.value not in subst and param.default is not None:
            subst[param.name.value] = param.default
    return subst
