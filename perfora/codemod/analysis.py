"""Read a training script: where the model, optimizer, scheduler, wrapper, argparse and loops
are, with line numbers, and what is too irregular to change safely.

Both modes' transforms consume the :class:`Script` this module builds; nothing here edits.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .findings import MANUAL, NOTE, Finding
from .syntax import (
    assigned_names,
    code,
    dotted,
    inner_comments,
    root_names,
    substitute,
)

SCOPE_TYPES = (cst.FunctionDef,)
LOOP_TYPES = (cst.For, cst.While)
WRAPPERS = {"torch.nn.DataParallel": "DataParallel",
            "torch.nn.parallel.DataParallel": "DataParallel",
            "torch.nn.parallel.data_parallel.DataParallel": "DataParallel",
            "torch.nn.parallel.DistributedDataParallel": "DistributedDataParallel",
            "torch.nn.parallel.distributed.DistributedDataParallel": "DistributedDataParallel"}
LOCAL = "<local>"
"""``Analyzer.calls_in`` key for calls of the script's own (module- or function-level) defs."""
LineOf = Callable[[cst.CSTNode], int]
"""How transforms ask for a node's line number (for their notes)."""
MINIMIZE = re.compile(r"loss|err|mse|mae|rmse|nll|perplex|ppl|cost", re.I)
METRIC = re.compile(r"acc|loss|score|metric|f1|auc|err|mse|mae|rmse|ppl|perplex|prec|recall|iou"
                    r"|map|bleu|r2", re.I)
VALIDATION = re.compile(r"val|valid|dev|eval|holdout", re.I)
TEST = re.compile(r"test", re.I)


@dataclass
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


@dataclass
class Wrap:
    """``W = DataParallel/DistributedDataParallel(X, ...)``."""

    stmt: cst.SimpleStatementLine
    call: cst.Call
    kind: str
    target: str


@dataclass
class BatchSite:
    """Where one batch is trained: the statements holding zero_grad() and backward()."""

    zero_grad: cst.BaseStatement | None
    backward: cst.BaseStatement
    scope: cst.FunctionDef | None
    model_name: str | None
    args_name: str | None


@dataclass
class Loop:
    """The epoch loop, the score reported once per epoch and what to remove from it."""

    node: cst.For | cst.While
    last: cst.BaseStatement
    score: str | None
    sched_steps: list[cst.BaseStatement] = field(default_factory=list)
    batch: BatchSite | None = None


@dataclass
class ArgParse:
    """The user's argparse: where to add flags and the name the parsed arguments get."""

    parse_stmt: cst.BaseStatement | None
    parser_var: str | None
    args_var: str | None
    existing_flags: set[str] = field(default_factory=set)


@dataclass
class Script:
    """Everything the transforms need, and the findings so far."""

    module: cst.Module
    findings: list[Finding]
    aliases: dict[str, str]
    used: set[str]
    already: str | None = None
    last_import: cst.BaseStatement | None = None
    argparse: ArgParse | None = None
    model_var: str | None = None
    scope: cst.FunctionDef | None = None
    insert_at: cst.BaseStatement | None = None
    optimizer: OptimizerSite | None = None
    wrap: Wrap | None = None
    loop: Loop | None = None
    args_visible: bool = False

    def unique(self, name: str) -> str:
        """``name``, or ``perfora_<name>`` when the script already uses it."""
        return name if name not in self.used else f"perfora_{name}"


class _Collector(cst.CSTVisitor):
    """Every node's parent, and every call, function definition, loop and import alias.

    One pass over the tree: the analysis then answers "which calls are inside this node"
    from these lists and the parents (:meth:`Analyzer.calls_in`) instead of visiting
    subtrees again, which kept large scripts from converting in linear time.
    """

    def __init__(self) -> None:
        self.parents: dict[int, cst.CSTNode] = {}   # id(node) -> its parent
        self._stack: list[cst.CSTNode] = []
        self.calls: list[cst.Call] = []
        self.attr_calls: dict[str, list[cst.Call]] = {}  # "step" -> every x.step(...) call
        self.defs: dict[str, cst.FunctionDef] = {}
        self.loops: list[cst.For | cst.While] = []
        self.aliases: dict[str, str] = {}
        self.names: set[str] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        """Record the node's parent, then dispatch to ``visit_<Type>``."""
        if self._stack:
            self.parents[id(node)] = self._stack[-1]
        self._stack.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        """Dispatch to ``leave_<Type>``, then step back to the parent."""
        super().on_leave(original_node)
        self._stack.pop()

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)
        if isinstance(node.func, cst.Attribute):
            self.attr_calls.setdefault(node.func.attr.value, []).append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.defs.setdefault(node.name.value, node)

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)

    def visit_While(self, node: cst.While) -> None:
        self.loops.append(node)

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted(alias.name)
            if full is None:
                continue
            if alias.asname is not None:
                self.aliases[alias.asname.name.value] = full
            else:
                self.aliases.setdefault(full.split(".")[0], full.split(".")[0])

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        base = dotted(node.module) if node.module is not None else None
        if base is None or node.relative or isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            name = dotted(alias.name)
            local = alias.asname.name.value if alias.asname is not None else name
            self.aliases[local] = f"{base}.{name}"


class Analyzer:
    """Builds a :class:`Script` from source text."""

    def __init__(self, source: str, score: str | None = None) -> None:
        self.module = cst.parse_module(source)
        self._top_lines: dict[int, int] | None = None  # id(top statement) -> lines above it
        self._positions: dict[int, Any] = {}  # id(top statement) -> its nodes' positions
        self.col = _Collector()
        self.module.visit(self.col)
        self.parents = self.col.parents
        self._calls_index: dict[str, dict[int, list[cst.Call]]] = {}
        self._backward_memo: dict[tuple[int, int], cst.Call | None] = {}
        self._module_level_names: set[str] | None = None
        self.score_name = score
        self.anchor: cst.CSTNode | None = None
        self.per_batch = False
        self.script = Script(self.module, [], self.col.aliases, self.col.names)

    # ------------------------------------------------------------------ helpers
    def line(self, node: cst.CSTNode) -> int:
        """The 1-based line a node starts on.

        Positions are computed only for the module-level statement holding the node (libcst's
        PositionProvider over that one statement), offset by the lines above it: resolving
        them for the whole module cost most of the analysis of a large script.
        """
        top = node
        for anc in self.ancestors(node):
            if isinstance(anc, cst.Module):
                break
            top = anc
        if top is self.module:
            return 1
        if self._top_lines is None:
            above = sum(self.module.code_for_node(line).count("\n")
                        for line in self.module.header)
            self._top_lines = {}
            for stmt in self.module.body:
                self._top_lines[id(stmt)] = above
                above += self.module.code_for_node(stmt).count("\n")
        positions = self._positions.get(id(top))
        if positions is None:
            alone = self.module.with_changes(body=[top], header=[], footer=[])
            wrapper = MetadataWrapper(alone, unsafe_skip_copy=True)
            positions = self._positions[id(top)] = wrapper.resolve(PositionProvider)
        return self._top_lines[id(top)] + positions[node].start.line

    def manual(self, node: cst.CSTNode | int, message: str) -> None:
        """Record something the user must do by hand, at a node's line."""
        line = node if isinstance(node, int) else self.line(node)
        self.script.findings.append(Finding(line, message, MANUAL))

    def note(self, node: cst.CSTNode | int, message: str) -> None:
        """Record what the conversion did, at a node's line."""
        line = node if isinstance(node, int) else self.line(node)
        self.script.findings.append(Finding(line, message, NOTE))

    def canonical(self, node: cst.CSTNode) -> str | None:
        """The dotted name with import aliases resolved (``DDP`` -> ``torch.nn...``)."""
        name = dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        full = self.col.aliases.get(head, head)
        return f"{full}.{rest}" if rest else full

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The node's parent (None for the module)."""
        return self.parents.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Parents, nearest first."""
        node = self.parent(node)
        while node is not None:
            yield node
            node = self.parent(node)

    def statement(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The statement (a member of an IndentedBlock or the Module body) holding node."""
        while True:
            parent = self.parent(node)
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                return node
            node = parent

    def scope(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The function a node is in (None: module level)."""
        for anc in self.ancestors(node):
            if isinstance(anc, SCOPE_TYPES):
                return anc
        return None

    def block_of(self, stmt: cst.CSTNode) -> cst.IndentedBlock | cst.Module:
        """The block whose body holds a statement."""
        return self.parent(stmt)

    def calls_in(self, node: cst.CSTNode, attr: str) -> list[cst.Call]:
        """Calls ``<x>.attr(...)`` (``attr=LOCAL``: calls of the script's own functions)
        inside ``node``, not inside function definitions nested in it, in source order.

        Answered from an index built once per ``attr`` (each call walks its ancestors up to
        its function), so asking for every loop of a large script stays linear.
        """
        index = self._calls_index.get(attr)
        if index is None:
            index = self._calls_index[attr] = {}
            if attr == LOCAL:
                defs = self.col.defs
                calls = [c for c in self.col.calls
                         if isinstance(c.func, cst.Name) and c.func.value in defs]
            else:
                calls = self.col.attr_calls.get(attr, [])
            for call in calls:
                prev: cst.CSTNode = call
                for anc in self.ancestors(call):
                    if isinstance(anc, cst.FunctionDef):
                        if prev is anc.body:  # not its decorators or default values
                            index.setdefault(id(anc), []).append(call)
                        break
                    index.setdefault(id(anc), []).append(call)
                    prev = anc
        return index.get(id(node), [])

    def module_level_names(self) -> set[str]:
        """Names bound by module-level statements other than function and class definitions."""
        if self._module_level_names is None:
            self._module_level_names = set().union(*(
                assigned_names(st) for st in self.module.body
                if not isinstance(st, (cst.FunctionDef, cst.ClassDef))))
        return self._module_level_names

    @staticmethod
    def is_main_guard(node: cst.CSTNode) -> bool:
        """``if __name__ == "__main__":`` (not a condition for the converter)."""
        return isinstance(node, cst.If) and "__name__" in code(node.test) \
            and "__main__" in code(node.test)

    def guards(self, node: cst.CSTNode, scope: cst.FunctionDef | None) -> list[cst.CSTNode]:
        """If/Try/loop/Else nodes between node and its scope (the __main__ guard excluded)."""
        found = []
        for anc in self.ancestors(node):
            if anc is scope:
                break
            if isinstance(anc, (cst.If, cst.Try, cst.Else, cst.ExceptHandler, cst.Finally,
                                cst.For, cst.While, cst.IfExp)) and not self.is_main_guard(anc):
                found.append(anc)
        return found

    def top_in_block(self, node: cst.CSTNode, block: cst.CSTNode) -> cst.CSTNode | None:
        """The statement of ``block`` that contains ``node`` (None if outside it)."""
        prev = node
        for anc in self.ancestors(node):
            if anc is block:
                return prev
            prev = anc
        return None

    def index_in_block(self, stmt: cst.CSTNode) -> int:
        """A statement's position in its block."""
        return list(self.block_of(stmt).body).index(stmt)

    # ------------------------------------------------------------------ analysis
    def run(self) -> Script:
        """Find every part, in dependency order; the script with its findings."""
        s = self.script
        s.already = self._already_converted()
        if s.already:
            return s
        s.last_import = self._last_import()
        s.argparse = self._argparse()
        s.optimizer = self._optimizer()
        self._wrap_and_model()
        self._loop()
        self._args_visibility()
        return s

    def _already_converted(self) -> str | None:
        for call in self.col.calls:
            name = self.canonical(call.func) or ""
            if name in ("perfora.perforate", "perfora.GrowthController"):
                return "native"
            if name.endswith("utils_perforatedai.perforate_model") or \
                    name.endswith("utils_perforatedai.initialize_pai"):
                return "compat"
        return None

    def _last_import(self) -> cst.BaseStatement | None:
        last = None
        for stmt in self.module.body:
            if isinstance(stmt, cst.SimpleStatementLine) and all(
                    isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
                last = stmt
            elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or (
                    isinstance(stmt, cst.BaseCompoundStatement) and last is not None):
                break
        return last

    # ---------------------------------------------------------------- argparse
    def _argparse(self) -> ArgParse | None:
        parsers = [c for c in self.col.calls
                   if self.canonical(c.func) == "argparse.ArgumentParser"]
        if not parsers:
            return None
        call = parsers[0]
        stmt = self.statement(call)
        parser_var = None
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign) \
                and isinstance(stmt.body[0].targets[0].target, cst.Name):
            parser_var = stmt.body[0].targets[0].target.value
        flags = set()
        for c in self.col.attr_calls.get("add_argument", []):
            for arg in c.args:
                if isinstance(arg.value, cst.SimpleString) and arg.keyword is None:
                    flags.add(arg.value.evaluated_value)
        parse_calls = [c for c in self.col.attr_calls.get("parse_args", [])
                       + self.col.attr_calls.get("parse_known_args", [])
                       if parser_var and dotted(c.func.value) == parser_var]
        if len(parse_calls) != 1:
            self.manual(call, "argparse: found the parser but not one "
                        f"`{parser_var or 'parser'}.parse_args()` call; add the flags by hand")
            return ArgParse(None, parser_var, None, flags)
        parse = parse_calls[0]
        pstmt = self.statement(parse)
        args_var = None
        small = pstmt.body[0] if isinstance(pstmt, cst.SimpleStatementLine) else None
        if isinstance(small, cst.Assign):
            target = small.targets[0].target
            if isinstance(target, cst.Tuple):
                target = target.elements[0].value
            if isinstance(target, cst.Name):
                args_var = target.value
        elif isinstance(small, cst.Return):
            func = self.scope(pstmt)
            if func is not None:
                sites = [c for c in self.col.calls if dotted(c.func) == func.name.value]
                for site in sites:
                    st = self.statement(site)
                    if isinstance(st, cst.SimpleStatementLine) and isinstance(st.body[0],
                                                                              cst.Assign):
                        target = st.body[0].targets[0].target
                        if isinstance(target, cst.Name):
                            args_var = target.value
        if args_var is None:
            self.manual(parse, "argparse: could not tell which name holds the parsed "
                        "arguments; add the flags by hand")
        return ArgParse(pstmt, parser_var, args_var, flags)

    # --------------------------------------------------------------- optimizer
    def _is_optimizer(self, call: cst.Call) -> bool:
        name = self.canonical(call.func) or ""
        return name.startswith("torch.optim.") and ".lr_scheduler." not in name \
            and name.rsplit(".", 1)[-1][:1].isupper() and name.count(".") == 2

    def _is_scheduler(self, call: cst.Call) -> bool:
        name = self.canonical(call.func) or ""
        return name.startswith("torch.optim.lr_scheduler.") and \
            name.rsplit(".", 1)[-1][:1].isupper()

    def _signature_names(self, call: cst.Call) -> list[str] | None:
        name = self.canonical(call.func) or ""
        try:
            import importlib

            module, _, cls = name.rpartition(".")
            obj = getattr(importlib.import_module(module), cls)
            return [p for p in inspect.signature(obj).parameters if p != "self"]
        except (ImportError, AttributeError, ValueError, TypeError):
            return None

    def _kwargs(self, call: cst.Call, first: str) -> tuple[cst.CSTNode | None,
                                                         list[tuple[str, cst.CSTNode]] | None]:
        """(the first argument, the rest as (keyword, expression)); None if unmappable."""
        head = None
        rest: list[tuple[str, cst.CSTNode]] = []
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if any(a.star for a in call.args):
            return None, None
        names = None
        for i, arg in enumerate(positional):
            if i == 0:
                head = arg.value
                continue
            if names is None:
                names = self._signature_names(call)
                if names is None:
                    return head, None
            rest.append((names[i], arg.value))
        for arg in call.args:
            if arg.keyword is not None:
                if arg.keyword.value == first:
                    head = arg.value
                else:
                    rest.append((arg.keyword.value, arg.value))
        return head, rest

    def _optimizer(self) -> OptimizerSite | None:
        optimizers = [c for c in self.col.calls if self._is_optimizer(c)]
        if not optimizers:
            self.manual(1, "no optimizer construction (torch.optim.<Class>(...)) found: "
                        "register yours with controller.set_optimizer(cls, **kwargs) by hand")
            return None
        conditional = [c for c in optimizers if self.guards(c, self.scope(c))]
        if conditional:
            call = conditional[0]
            guard = self.guards(call, self.scope(call))[-1]
            lines = ", ".join(str(self.line(c)) for c in optimizers)
            self.manual(call, f"the optimizer is built conditionally or in a loop (line "
                        f"{self.line(guard)}; optimizer at lines {lines}): left as it is. "
                        "Choose the optimizer class and arguments and register them by hand "
                        "(native: controller.set_optimizer(cls, **kwargs) then optimizer, "
                        "scheduler = controller.build_optimizer(); compat: GPA.pai_tracker."
                        "set_optimizer(cls) + setup_optimizer(model, optimArgs, schedArgs)), "
                        "and take the rebuilt optimizer after every restructure")
            self._fallback(optimizers)
            return None
        if len(optimizers) > 1:
            lines = ", ".join(str(self.line(c)) for c in optimizers)
            self.manual(optimizers[0], f"several optimizers (lines {lines}): perfora rebuilds "
                        "one optimizer after each restructure, so these lines were left as "
                        "they are. Register the one over the perforated model by hand "
                        "(controller.set_optimizer(cls, **kwargs) / "
                        "GPA.pai_tracker.set_optimizer + setup_optimizer) and rebuild the "
                        "others over model.parameters() after every restructure")
            self._fallback(optimizers)
            return None
        call = optimizers[0]
        func = self.scope(call)
        params, kwargs = self._kwargs(call, "params")
        model_var = None
        if isinstance(params, cst.Call) and isinstance(params.func, cst.Attribute) \
                and params.func.attr.value == "parameters" and not params.args \
                and isinstance(params.func.value, cst.Name):
            model_var = params.func.value.value
        if model_var is None or kwargs is None:
            self._fallback(optimizers)
            why = ("its parameters are not `model.parameters()` (parameter groups or a "
                   "subset)" if model_var is None else "its positional arguments could not "
                   "be mapped to names")
            self.manual(call, f"the optimizer at this line is left as it is: {why}. perfora "
                        "rebuilds the optimizer over all trainable parameters after each "
                        "restructure; register it by hand (set_optimizer_instance(optimizer) "
                        "and build a new one after every restructure)")
            return None
        stmt = self.statement(call)
        helper = None
        if func is not None and model_var in [p.name.value for p in func.params.params]:
            helper = func
        if helper is not None:
            return self._optimizer_in_helper(call, helper, model_var, kwargs)
        opt_var = self._assigned_name(stmt, call)
        if opt_var is None:
            self.manual(call, "the optimizer is not assigned to one name (`optimizer = ...`); "
                        "left as it is: register it by hand")
            return None
        site = OptimizerSite([stmt], stmt, opt_var, None, code(call.func),
                             [(k, code(v)) for k, v in kwargs],
                             opt_comment=inner_comments(stmt))
        site.used_names = set().union(*(root_names(v) for _, v in kwargs)) if kwargs else set()
        self.script.model_var = model_var
        self.script.scope = func
        self.anchor = stmt
        if not self._scheduler(site, func, opt_var, {}):
            return None
        return site

    def _fallback(self, optimizers: list[cst.Call]) -> None:
        """Irregular optimizers: still find the model, so the rest can be converted."""
        call = optimizers[0]
        params, _ = self._kwargs(call, "params")
        if not (isinstance(params, cst.Call) and isinstance(params.func, cst.Attribute)
                and isinstance(params.func.value, cst.Name)):
            return
        scope = self.scope(call)
        if scope is not None and params.func.value.value in [p.name.value
                                                             for p in scope.params.params]:
            return  # built in a helper: no model here
        block_owner = scope.body if scope is not None else self.module
        stmt = self.statement(call)
        # the statement of the scope's outermost block holding the optimizer(s)
        top = stmt
        for anc in self.ancestors(stmt):
            if anc is block_owner or anc is scope:
                break
            if isinstance(anc, cst.BaseStatement) and isinstance(
                    self.parent(anc), (cst.IndentedBlock, cst.Module)) and \
                    not self.is_main_guard(anc):
                top = anc
        self.script.model_var = params.func.value.value
        self.script.scope = scope
        self.anchor = top

    def _assigned_name(self, stmt: cst.CSTNode, call: cst.Call) -> str | None:
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
                and isinstance(stmt.body[0], cst.Assign) and stmt.body[0].value is call \
                and len(stmt.body[0].targets) == 1 \
                and isinstance(stmt.body[0].targets[0].target, cst.Name):
            return stmt.body[0].targets[0].target.value
        return None

    def _scheduler(self, site: OptimizerSite, func: cst.FunctionDef | None, opt_var: str,
                   subst: dict[str, cst.CSTNode]) -> bool:
        """Find the scheduler over ``opt_var`` in ``func``; False when it is irregular."""
        scheds = [c for c in self.col.calls if self._is_scheduler(c) and self.scope(c) is func]
        mine = []
        for c in scheds:
            head, kwargs = self._kwargs(c, "optimizer")
            if isinstance(head, cst.Name) and head.value == opt_var:
                mine.append((c, kwargs))
        if not mine:
            return True
        if len(mine) > 1 or self.guards(mine[0][0], func) or mine[0][1] is None:
            c = mine[0][0]
            self.manual(c, "the LR scheduler is built more than once, conditionally, or with "
                        "arguments that could not be mapped: the optimizer and scheduler were "
                        "left as they are; register them by hand")
            return False
        call, kwargs = mine[0]
        stmt = self.statement(call)
        var = self._assigned_name(stmt, call)
        if var is None and not subst:
            self.manual(call, "the LR scheduler is not assigned to one name; left as it is")
            return False
        kwargs = [(k, substitute(v, subst)) for k, v in kwargs]
        site.sched_var = site.sched_var or var
        site.sched_cls = code(call.func)
        site.sched_kwargs = [(k, code(v)) for k, v in kwargs]
        site.used_names |= set().union(*(root_names(v) for _, v in kwargs)) if kwargs else set()
        if (self.canonical(call.func) or "").endswith("ReduceLROnPlateau"):
            mode = dict(kwargs).get("mode")
            site.plateau_mode = mode.evaluated_value if isinstance(
                mode, cst.SimpleString) else "min" if mode is None else None
        if not subst and stmt not in site.stmts:
            site.stmts.append(stmt)
            site.sched_comment = inner_comments(stmt)
        return True

    def _optimizer_in_helper(self, call: cst.Call, helper: cst.FunctionDef, model_param: str,
                             kwargs: list[tuple[str, cst.CSTNode]]) -> OptimizerSite | None:
        """``opt, sched = make_optimizer(model, lr)``: inline the helper's recipe."""
        sites = [c for c in self.col.calls if dotted(c.func) == helper.name.value]
        if len(sites) != 1:
            self.manual(helper, f"the optimizer is built in `{helper.name.value}()`, which is "
                        f"called {len(sites)} times; left as it is: register it by hand")
            return None
        site_call = sites[0]
        site_stmt = self.statement(site_call)
        outer = self.scope(site_call)
        if self.guards(site_call, outer):
            self.manual(site_call, f"`{helper.name.value}()` is called conditionally; left as "
                        "it is: register the optimizer by hand")
            return None
        # map the helper's parameters to the call site's arguments
        subst: dict[str, cst.CSTNode] = {}
        params = list(helper.params.params)
        positional = [a for a in site_call.args if a.keyword is None]
        if any(a.star for a in site_call.args) or len(positional) > len(params):
            self.manual(site_call, "could not map the call's arguments to "
                        f"`{helper.name.value}()`'s parameters; register the optimizer by hand")
            return None
        for param, arg in zip(params, positional):
            subst[param.name.value] = arg.value
        for arg in site_call.args:
            if arg.keyword is not None:
                subst[arg.keyword.value] = arg.value
        for param in params:
            if param.name.value not in subst and param.default is not None:
                subst[param.name.value] = param.default
        model_arg = subst.get(model_param)
        if not isinstance(model_arg, cst.Name):
            self.manual(site_call, "the model passed to the optimizer helper is not a plain "
                        "name; register the optimizer by hand")
            return None
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
        local_opt = self._assigned_name(self.statement(call), call)
        if not allowed or not isinstance(body[-1].body[0], cst.Return):
            self.manual(helper, f"`{helper.name.value}()` does more than build and return the "
                        "optimizer/scheduler; left as it is: register them by hand")
            return None
        if not isinstance(site_stmt, cst.SimpleStatementLine) or \
                not isinstance(site_stmt.body[0], cst.Assign):
            self.manual(site_call, "the optimizer helper's result is not assigned; register "
                        "the optimizer by hand")
            return None
        target = site_stmt.body[0].targets[0].target
        names = [e.value.value for e in target.elements] if isinstance(target, cst.Tuple) \
            and all(isinstance(e.value, cst.Name) for e in target.elements) else \
            [target.value] if isinstance(target, cst.Name) else None
        returned = body[-1].body[0].value
        ret = [dotted(e.value) for e in returned.elements] if isinstance(returned, cst.Tuple) \
            else [dotted(returned) if returned is not call else local_opt or "<opt>"]
        if names is None or len(names) != len(ret):
            self.manual(site_call, "could not match the helper's return value to the names "
                        "assigned here; register the optimizer by hand")
            return None
        by_local = dict(zip(ret, names))
        opt_local = local_opt if local_opt is not None else "<opt>"
        opt_var = by_local.get(opt_local)
        if returned is call:
            opt_var = names[0]
        if opt_var is None:
            self.manual(site_call, "the helper does not return its optimizer; register it by "
                        "hand")
            return None
        kwargs = [(k, substitute(v, subst)) for k, v in kwargs]
        site = OptimizerSite([site_stmt], site_stmt, opt_var, None, code(call.func),
                             [(k, code(v)) for k, v in kwargs],
                             opt_comment=inner_comments(site_stmt))
        site.used_names = set().union(*(root_names(v) for _, v in kwargs)) if kwargs else set()
        sched_local = next((r for r in ret if r not in (opt_local,)), None)
        if sched_local is not None:
            site.sched_var = by_local[sched_local]
        if local_opt is not None and not self._scheduler(site, helper, local_opt, subst):
            return None
        if site.sched_cls is None:
            site.sched_var = None
        self.script.model_var = model_arg.value
        self.script.scope = outer
        self.anchor = site_stmt
        self.note(site_call, f"the optimizer recipe of `{helper.name.value}()` (line "
                  f"{self.line(helper)}) was inlined here; the helper is no longer called")
        return site

    # ----------------------------------------------------------- wrap and model
    def _wrap_and_model(self) -> None:
        s, site, anchor = self.script, self.script.optimizer, self.anchor
        if anchor is None or s.model_var is None:
            return
        wraps = []
        for c in self.col.calls:
            kind = WRAPPERS.get(self.canonical(c.func) or "")
            if kind is None or self.scope(c) is not s.scope:
                continue
            stmt = self.statement(c)
            target = None
            if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)\
                    and stmt.body[0].value is c:
                t = stmt.body[0].targets[0].target
                target = t.value if isinstance(t, cst.Name) else None
            first = c.args[0].value if c.args else None
            while isinstance(first, cst.Call) and isinstance(first.func, cst.Attribute):
                first = first.func.value  # DDP(model.to(device)) -> model
            inner = dotted(first)
            if target is None or s.model_var not in (inner, target) or inner is None \
                    or "." in inner:
                self.manual(c, f"{kind}(...) here does not have the form `model = {kind}"
                            "(model, ...)`; left as it is")
                continue
            if target == s.model_var and inner != s.model_var:
                s.model_var = inner  # optimizer over ddp_model.parameters(): grow `model`
            wraps.append(Wrap(stmt, c, kind, target))
        if len(wraps) > 1:
            self.manual(wraps[1].stmt, "several DataParallel/DDP wraps; only the first (line "
                        f"{self.line(wraps[0].stmt)}) is handled")
        s.wrap = wraps[0] if wraps else None
        block = self.block_of(anchor)
        first = anchor
        # perforate before the wrap and before torch.compile(model), in this block
        later = [s.wrap.stmt] if s.wrap is not None else []
        later += [self.statement(c) for c in self.col.calls
                  if self.canonical(c.func) == "torch.compile" and self.scope(c) is s.scope
                  and c.args and dotted(c.args[0].value) == s.model_var]
        for stmt in later:
            top = self.top_in_block(stmt, block)
            if top is not None and self.index_in_block(top) < self.index_in_block(first):
                first = top
        # the model must exist before: assigned earlier in this block, or a parameter
        index = self.index_in_block(first)
        before = list(block.body)[:index]
        params = {p.name.value for p in s.scope.params.params} if s.scope else set()
        if not any(s.model_var in assigned_names(st) for st in before) and \
                s.model_var not in params:
            self.manual(anchor, f"`{s.model_var}` is not created in the same block before "
                        "the optimizer; convert the model by hand right after it is created")
            s.optimizer = None
            return
        s.insert_at = first
        # moving the optimizer up to `first` must not read names bound in between
        between = list(block.body)[index:self.index_in_block(anchor)]
        late = set().union(*(assigned_names(st) for st in between)) if between else set()
        clash = sorted(site.used_names & late) if site is not None else []
        if clash:
            self.manual(site.anchor, f"the optimizer must be built before the {s.wrap.kind} "
                        f"wrap (line {self.line(s.wrap.stmt)}), but its arguments use "
                        f"{', '.join(clash)}, set after that line; left as it is: move it by "
                        "hand")
            s.optimizer = None

    # --------------------------------------------------------------------- loop
    def _reaches_backward(self, node: cst.CSTNode, depth: int = 0) -> cst.Call | None:
        key = (id(node), depth)
        if key not in self._backward_memo:
            self._backward_memo[key] = self._find_backward(node, depth)
        return self._backward_memo[key]

    def _find_backward(self, node: cst.CSTNode, depth: int) -> cst.Call | None:
        calls = self.calls_in(node, "backward")
        if calls:
            return calls[0]
        if depth > 2:
            return None
        for c in self._local_calls(node):
            found = self._reaches_backward(self.col.defs[dotted(c.func)], depth + 1)
            if found is not None:
                return found
        return None

    def _is_epoch_loop(self, loop: cst.For | cst.While) -> bool:
        """A loop whose backward() runs inside another (batch) loop, here or in a helper."""
        backward = self._reaches_backward(loop)
        if backward is None:
            return False
        inner = next((a for a in self.ancestors(backward) if isinstance(a, LOOP_TYPES)), None)
        return inner is not None and inner is not loop

    def _local_calls(self, node: cst.CSTNode) -> list[cst.Call]:
        """Calls of the script's own functions inside ``node`` (not in nested defs)."""
        return self.calls_in(node, LOCAL)

    def _loop(self) -> None:
        s = self.script
        scope = s.scope
        if s.insert_at is None:
            return  # no model to grow: nothing to report a score for
        candidates = [lp for lp in self.col.loops if self.scope(lp) is scope
                      and self._reaches_backward(lp) is not None]
        ids = {id(lp) for lp in candidates}
        outer = [lp for lp in candidates
                 if not any(id(a) in ids for a in self.ancestors(lp))]
        elsewhere = None if outer else next(
            (lp for lp in self.col.loops
             if self.scope(lp) is not scope and self._is_epoch_loop(lp)), None)
        if elsewhere is not None:
            loop = elsewhere
            self.manual(loop, f"the epoch loop is in `{self.scope(loop).name.value}()`, not "
                        f"where the optimizer is built (line {self.line(s.insert_at)}): left as "
                        "it is. Pass the controller (native) or the optimizer arguments "
                        "(compat) to it and report the validation score at the end of each "
                        "epoch by hand (native: decision = controller.step(score); compat: "
                        "model, restructured, training_complete = GPA.pai_tracker."
                        "add_validation_score(score, model)), then rebuild the optimizer when "
                        "restructured")
            return
        if not outer:
            self.manual(s.insert_at or 1, "no recognisable training loop (an epoch loop "
                        "around a batch loop that calls loss.backward()): report the "
                        "validation score once per epoch by hand (native: decision = "
                        "controller.step(score); compat: model, restructured, "
                        "training_complete = GPA.pai_tracker.add_validation_score(score, "
                        "model)) and rebuild the optimizer when restructured")
            return
        if len(outer) > 1:
            lines = ", ".join(str(self.line(lp)) for lp in outer)
            self.manual(outer[0], f"several training loops (lines {lines}); none was changed: "
                        "report the validation score once per epoch in the one that grows "
                        "the model, by hand")
            return
        loop = outer[0]
        if s.insert_at is not None and self.line(loop) < self.line(s.insert_at):
            self.manual(loop, "the training loop starts before the optimizer is built; "
                        "left as it is")
            return
        backward = self._reaches_backward(loop)
        batch_loop = next((a for a in self.ancestors(backward) if isinstance(a, LOOP_TYPES)),
                          None)
        if batch_loop is loop:
            self.manual(loop, "this loop trains batches but has no epoch loop around it "
                        "(no recognisable epoch): left as it is. Report a validation score by "
                        "hand at the end of each evaluation period (native: decision = "
                        "controller.step(score), take decision.optimizer when "
                        "decision.restructured, stop when decision.complete; compat: model, "
                        "restructured, training_complete = GPA.pai_tracker."
                        "add_validation_score(score, model))")
            return
        if not isinstance(loop.body, cst.IndentedBlock):
            self.manual(loop, "one-line loop; report the validation score by hand")
            return
        steps = self._sched_steps(loop, backward) if s.optimizer is not None else []
        if self.per_batch:
            s.optimizer, steps = None, []
        score = self._score(loop)
        if score is None:
            self.manual(loop, "no validation score found in this epoch loop (a name like "
                        "val_acc, val_loss, valid_score assigned in its body): the loop was "
                        "left as it is. Compute one every epoch and pass --score NAME, or "
                        "report it by hand at the end of the epoch (native: decision = "
                        "controller.step(score); compat: model, restructured, "
                        "training_complete = GPA.pai_tracker.add_validation_score(score, "
                        "model))")
            return
        s.loop = Loop(loop, loop.body.body[-1], score, steps)
        s.loop.batch = self._batch(backward, loop)

    def _score(self, loop: cst.For | cst.While) -> str | None:
        """The validation score's name: --score, ReduceLROnPlateau's argument, or a guess."""
        assigned: list[str] = []
        for stmt in loop.body.body:
            if isinstance(stmt, (cst.SimpleStatementLine, cst.With)):
                text = code(stmt)
                for name in sorted(assigned_names(stmt), key=text.find):
                    if name not in assigned:
                        assigned.append(name)
        site = self.script.optimizer
        if self.score_name is not None:
            if self.score_name not in assigned:
                self.manual(loop, f"--score {self.score_name}: not assigned in the body of "
                            "this epoch loop")
                return None
            return self.score_name
        if site is not None and site.sched_var:
            for c in self.calls_in(loop, "step"):
                if dotted(c.func.value) == site.sched_var and c.args \
                        and isinstance(c.args[0].value, cst.Name) \
                        and c.args[0].value.value in assigned:
                    return c.args[0].value.value
        ranked = [n for n in assigned if VALIDATION.search(n) and METRIC.search(n)] + \
                 [n for n in assigned if TEST.search(n) and METRIC.search(n)] + \
                 [n for n in assigned if METRIC.search(n) and "train" not in n.lower()]
        if not ranked:
            return None
        self.note(loop, f"reporting `{ranked[0]}` as the validation score "
                  f"({'minimized' if MINIMIZE.search(ranked[0]) else 'maximized'}); "
                  "--score NAME and --maximize/--minimize choose otherwise")
        return ranked[0]

    def _batch(self, backward: cst.Call, loop: cst.CSTNode) -> BatchSite | None:
        s = self.script
        bstmt = self.statement(backward)
        block = self.block_of(bstmt)
        body = list(block.body)
        zero = None
        for st in body[:body.index(bstmt)]:
            if self.calls_in(st, "zero_grad"):
                zero = st
        func = self.scope(bstmt)
        model_name = None
        if func is s.scope or (func is not None and any(a is s.scope
                                                        for a in self.ancestors(func))):
            model_name = s.model_var
        elif func is not None:
            # a helper called from the loop: which parameter gets the model?
            params = [p.name.value for p in func.params.params]
            for c in self._local_calls(loop):
                if dotted(c.func) != func.name.value:
                    continue
                for i, arg in enumerate(c.args):
                    if dotted(arg.value) in (s.model_var, s.wrap.target if s.wrap else None):
                        if arg.keyword is not None:
                            model_name = arg.keyword.value
                        elif i < len(params):
                            model_name = params[i]
        args_name = None
        ap = s.argparse
        if ap is not None and ap.args_var is not None:
            module_level = ap.args_var in self.module_level_names()
            params = [p.name.value for p in func.params.params] if func else []
            if module_level or ap.args_var in params or func is s.scope or (
                    func is not None and any(a is s.scope for a in self.ancestors(func))):
                args_name = ap.args_var
        return BatchSite(zero, bstmt, func, model_name, args_name)

    def _sched_steps(self, loop: cst.CSTNode, backward: cst.Call) -> list[cst.BaseStatement]:
        site = self.script.optimizer
        if site.sched_var is None:
            return []
        batch_loop = next((a for a in self.ancestors(backward) if isinstance(a, LOOP_TYPES)),
                          None)
        names = {site.sched_var: loop}
        found = []
        for c in self._local_calls(loop):  # helpers that receive the scheduler
            func = self.col.defs[dotted(c.func)]
            params = [p.name.value for p in func.params.params]
            for i, arg in enumerate(c.args):
                if dotted(arg.value) == site.sched_var:
                    name = arg.keyword.value if arg.keyword else params[i] if i < len(
                        params) else None
                    if name:
                        names[name] = func
        for name, where in names.items():
            for c in self.calls_in(where, "step"):
                if dotted(c.func.value) != name:
                    continue
                stmt = self.statement(c)
                if batch_loop is not None and any(a is batch_loop for a in self.ancestors(c)):
                    self.manual(c, f"`{name}.step()` runs every batch, but perfora steps the "
                                "scheduler it rebuilds once per epoch: the optimizer and "
                                f"scheduler (line {self.line(site.anchor)}) were left as they "
                                "are. Keep stepping it yourself: build the optimizer and "
                                "scheduler again over model.parameters() after every "
                                "restructure (native: ctl.set_optimizer_instance(optimizer))")
                    self.per_batch = True
                    continue
                if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
                        and isinstance(stmt.body[0], cst.Expr):
                    found.append(stmt)
        return found

    def _args_visibility(self) -> None:
        s = self.script
        ap = s.argparse
        if ap is None or ap.args_var is None or s.insert_at is None:
            s.args_visible = ap is None  # a new module-level parser is visible everywhere
            return
        params = [p.name.value for p in s.scope.params.params] if s.scope else []
        module_level = ap.args_var in self.module_level_names()
        local = s.scope is not None and any(
            ap.args_var in assigned_names(st) for st in s.scope.body.body
            if not isinstance(st, (cst.FunctionDef, cst.ClassDef)))
        s.args_visible = module_level or local or ap.args_var in params
        if not s.args_visible:
            self.manual(s.insert_at, f"`{ap.args_var}` (the parsed arguments) is not visible "
                        "here: the resume/initialization flags were not used; pass the "
                        "arguments to this function and rerun perfora convert")


def analyze(source: str, score: str | None = None) -> Script:
    """Parse ``source`` (libcst, keeping every comment and blank line) and find its parts."""
    return Analyzer(source, score).run()
