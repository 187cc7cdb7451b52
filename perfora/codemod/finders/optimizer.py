"""The optimizer's construction (with its scheduler): class and arguments as written, the
model it trains and where; irregular ones are reported and left as they are."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ..findings import Finding
from ..syntax import code, inner_comments, param_names, root_names, substitute
from .calls import Kwargs, assigned_name, parameters_of, split_args
from .helper import read_helper
from .scheduler import Scheduler, find_scheduler
from .tree import Tree


@dataclass(frozen=True)
class OptimizerSite:
    """The optimizer (and scheduler) construction, with its class and arguments as written."""

    stmts: list[cst.BaseStatement]          # statements to remove (in the scope's blocks)
    anchor: cst.BaseStatement               # the first of them (or the helper's call site)
    opt_var: str
    sched_var: str | None
    opt_cls: str
    opt_kwargs: list[tuple[str, str]]
    sched_cls: str | None = None
    sched_kwargs: list[tuple[str, str]] = field(default_factory=list)
    plateau_mode: str | None = None
    used_names: set[str] = field(default_factory=set)
    opt_comment: str | None = None      # the comments written in/after the statements
    sched_comment: str | None = None


@dataclass(frozen=True)
class ModelSite:
    """The model the optimizer trains: its name, the function it is in, and the statement
    perfora's block goes before (the optimizer's, or the outermost one holding it)."""

    model_var: str
    scope: cst.FunctionDef | None
    anchor: cst.BaseStatement


@dataclass(frozen=True)
class Optimizers:
    """What :func:`find_optimizer` found: the site to rebuild (None: left as it is), the
    model (found even for most irregular optimizers) and the findings."""

    site: OptimizerSite | None
    model: ModelSite | None
    findings: list[Finding]


def is_optimizer(tree: Tree, call: cst.Call) -> bool:
    """``torch.optim.<Class>(...)`` (not a scheduler)."""
    name = tree.canonical(call.func) or ""
    return name.startswith("torch.optim.") and ".lr_scheduler." not in name \
        and name.rsplit(".", 1)[-1][:1].isupper() and name.count(".") == 2


def find_optimizer(tree: Tree) -> Optimizers:
    """The one unconditional ``optimizer = torch.optim.X(model.parameters(), ...)``, built
    here or in a helper, with its scheduler."""
    optimizers = [c for c in tree.calls if is_optimizer(tree, c)]
    if not optimizers:
        return Optimizers(None, None, [tree.manual(
            1, "no optimizer construction (torch.optim.<Class>(...)) found: register yours "
            "with controller.set_optimizer(cls, **kwargs) by hand")])
    conditional = [c for c in optimizers if tree.guards(c, tree.scope(c))]
    if conditional:
        call = conditional[0]
        guard = tree.guards(call, tree.scope(call))[-1]
        lines = ", ".join(str(tree.line(c)) for c in optimizers)
        return Optimizers(None, _fallback(tree, optimizers), [tree.manual(
            call, f"the optimizer is built conditionally or in a loop (line "
            f"{tree.line(guard)}; optimizer at lines {lines}): left as it is. Choose the "
            "optimizer class and arguments and register them by hand (native: "
            "controller.set_optimizer(cls, **kwargs) then optimizer, scheduler = "
            "controller.build_optimizer(); compat: GPA.pai_tracker.set_optimizer(cls) + "
            "setup_optimizer(model, optimArgs, schedArgs)), and take the rebuilt optimizer "
            "after every restructure")])
    if len(optimizers) > 1:
        lines = ", ".join(str(tree.line(c)) for c in optimizers)
        return Optimizers(None, _fallback(tree, optimizers), [tree.manual(
            optimizers[0], f"several optimizers (lines {lines}): perfora rebuilds one "
            "optimizer after each restructure, so these lines were left as they are. "
            "Register the one over the perforated model by hand (controller.set_optimizer(cls,"
            " **kwargs) / GPA.pai_tracker.set_optimizer + setup_optimizer) and rebuild the "
            "others over model.parameters() after every restructure")])
    call = optimizers[0]
    func = tree.scope(call)
    params, kwargs = split_args(tree, call, "params")
    model_var = parameters_of(params)
    if model_var is None or kwargs is None:
        why = ("its parameters are not `model.parameters()` (parameter groups or a subset)"
               if model_var is None else "its positional arguments could not be mapped to "
               "names")
        return Optimizers(None, _fallback(tree, optimizers), [tree.manual(
            call, f"the optimizer at this line is left as it is: {why}. perfora rebuilds the "
            "optimizer over all trainable parameters after each restructure; register it by "
            "hand (set_optimizer_instance(optimizer) and build a new one after every "
            "restructure)")])
    if func is not None and model_var in param_names(func):
        return _in_helper(tree, call, func, model_var, kwargs)
    stmt = tree.statement(call)
    opt_var = assigned_name(stmt, call)
    if opt_var is None:
        return Optimizers(None, None, [tree.manual(
            call, "the optimizer is not assigned to one name (`optimizer = ...`); left as it "
            "is: register it by hand")])
    model = ModelSite(model_var, func, stmt)
    sched, findings = find_scheduler(tree, func, opt_var, {})
    if findings:
        return Optimizers(None, model, findings)
    return Optimizers(optimizer_site(stmt, opt_var, call, kwargs, None, sched, {}), model, [])


def _in_helper(tree: Tree, call: cst.Call, helper: cst.FunctionDef, model_param: str,
               kwargs: Kwargs) -> Optimizers:
    """``opt, sched = make_optimizer(model, lr)``: inline the helper's recipe at its call."""
    found, findings = read_helper(tree, call, helper, model_param)
    if found is None:
        return Optimizers(None, None, findings)
    kwargs = [(k, substitute(v, found.subst)) for k, v in kwargs]
    sched = None
    if found.local_opt is not None:
        sched, findings = find_scheduler(tree, helper, found.local_opt, found.subst)
        if findings:
            return Optimizers(None, None, findings)
    site = optimizer_site(found.stmt, found.opt_var, call, kwargs, found.sched_var, sched,
                          found.subst)
    return Optimizers(site, ModelSite(found.model_var, found.scope, found.stmt), [tree.note(
        found.call, f"the optimizer recipe of `{helper.name.value}()` (line "
        f"{tree.line(helper)}) was inlined here; the helper is no longer called")])


def optimizer_site(stmt: cst.BaseStatement, opt_var: str, call: cst.Call, kwargs: Kwargs,
                   sched_var: str | None, sched: Scheduler | None,
                   subst: dict[str, cst.CSTNode]) -> OptimizerSite:
    """The site to rebuild: the optimizer ``call`` at ``stmt`` and the scheduler over it.

    The scheduler's own statement is removed too unless it sits in an inlined helper.
    """
    stmts = [stmt]
    sched_comment = None
    if sched is not None and not subst and sched.stmt not in stmts:
        stmts.append(sched.stmt)
        sched_comment = inner_comments(sched.stmt)
    used = set().union(*(root_names(v) for _, v in kwargs)) if kwargs else set()
    if sched is None:
        return OptimizerSite(stmts, stmt, opt_var, None, code(call.func),
                             [(k, code(v)) for k, v in kwargs], used_names=used,
                             opt_comment=inner_comments(stmt))
    return OptimizerSite(stmts, stmt, opt_var, sched_var or sched.var, code(call.func),
                         [(k, code(v)) for k, v in kwargs], sched.cls, sched.kwargs,
                         sched.plateau_mode, used | sched.used_names, inner_comments(stmt),
                         sched_comment)


def _fallback(tree: Tree, optimizers: list[cst.Call]) -> ModelSite | None:
    """Irregular optimizers: still find the model, so the rest can be converted."""
    call = optimizers[0]
    params, _ = split_args(tree, call, "params")
    if not (isinstance(params, cst.Call) and isinstance(params.func, cst.Attribute)
            and isinstance(params.func.value, cst.Name)):
        return None
    scope = tree.scope(call)
    if scope is not None and params.func.value.value in param_names(scope):
        return None  # built in a helper: no model here
    block_owner = scope.body if scope is not None else tree.module
    stmt = tree.statement(call)
    # the statement of the scope's outermost block holding the optimizer(s)
    top = stmt
    for anc in tree.ancestors(stmt):
        if anc is block_owner or anc is scope:
            break
        if isinstance(anc, cst.BaseStatement) and isinstance(
                tree.parent(anc), (cst.IndentedBlock, cst.Module)) and \
                not tree.is_main_guard(anc):
            top = anc
    return ModelSite(params.func.value.value, scope, top)

