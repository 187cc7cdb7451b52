"""Compat mode: the PerforatedAI recipe, step by step, with the PerforatedAI names perfora.compat
has.

Flags, ``UPA.perforate_model``, loading the newest ``switch_N`` before the optimizer,
``GPA.pai_tracker.setup_optimizer`` with the same types and arguments, the conditional
DataParallel/DDP wrap (``find_unused_parameters=True`` added), zero-filled gradients between
``zero_grad()`` and ``backward()``, the initialization run's exit after the first batch, and
``add_validation_score`` with ``restructured`` / ``training_complete``.
"""

from __future__ import annotations

import libcst as cst

from .analysis import LineOf, Script
from .common import (
    ConvertOptions,
    add_flags,
    add_imports,
    maximize_of,
    needs_import,
    note_done,
    opt_names,
)
from .compat_templates import (
    IMPORTS,
    INIT_EXIT,
    LOAD_BLOCK,
    PRE_INIT,
    PRE_INIT_DDP,
    PRE_INIT_DP,
    WRAP_DDP,
    WRAP_DP,
)
from .edits import Edits, statements, with_blank_line
from .findings import MANUAL, Finding
from .syntax import code


def compat_edits(script: Script, opts: ConvertOptions, line_of: LineOf) -> Edits:
    """The edits that apply the PerforatedAI recipe with ``perfora.compat``'s GPA/UPA names."""
    edits = Edits()
    s = script
    if s.insert_at is None:
        return edits
    imports = list(IMPORTS)
    x = s.model_var
    multi = s.wrap is not None
    flags = []
    if multi:
        help_text = ("Initialize PAI settings for DDP (run once)" if s.wrap.kind.startswith(
            "Distributed") else "Initialize PAI settings for multi-GPU (run once on single GPU)")
        flags.append(("--perforate_model_parallel", f"action='store_true', help={help_text!r}"))
    flags.append(("--pai_load_folder", "type=str, default=None, help='Folder to load PAI state "
                  "from (for automatic resumption)'"))
    args = add_flags(s, edits, flags, imports)
    maximize = maximize_of(s, opts)
    block = ["GPA.pc.set_testing_dendrite_capacity(False)  # a real run, not PerforatedAI's "
             "3-set smoke test"]
    block += [f"GPA.pc.set_{k}({v})" for k, v in opts.settings.items()]
    block.append(f"{x} = UPA.perforate_model({x}, save_name={opts.save_name!r}, "
                 f"maximizing_score={maximize})")
    stmts = with_blank_line(statements("\n".join(block)))
    if args is not None:
        stmts += with_blank_line(statements(LOAD_BLOCK.format(args=args, model=x)))
    optim_args, sched_args = s.unique("optimArgs"), s.unique("schedArgs")
    if s.optimizer is not None:
        site = s.optimizer
        opt, sched = opt_names(s)
        # the user's comments on the replaced lines, kept above them
        lines = [c for c in (site.opt_comment, site.sched_comment) if c]
        lines.append(f"GPA.pai_tracker.set_optimizer({site.opt_cls})  # SAME optimizer type")
        if site.sched_cls is not None:
            lines.append(f"GPA.pai_tracker.set_scheduler({site.sched_cls})  # SAME scheduler "
                         "type")
        lines.append(f"{optim_args} = {_dict(x, site.opt_kwargs)}  # SAME args")
        call_args = f"{x}, {optim_args}"
        if site.sched_cls is not None:
            lines.append(f"{sched_args} = {_dict(None, site.sched_kwargs)}  # SAME scheduler "
                         "args")
            call_args += f", {sched_args}"
        lines.append(f"{opt}, {sched} = GPA.pai_tracker.setup_optimizer({call_args})")
        stmts += with_blank_line(statements("\n".join(lines)))
        for stmt in site.stmts:
            edits.remove(stmt, keep_comments=False)  # they are on the new lines
    edits.insert_before(s.insert_at, stmts)
    note_done(s.findings, line_of(s.insert_at), f"UPA.perforate_model on `{x}`, the newest "
              "switch_N loaded before the optimizer" if args else
              f"UPA.perforate_model on `{x}`")
    if multi:
        _wrap(s, edits, args, line_of)
    _batch(s, edits, opts, imports, line_of, args if s.argparse is None else None)
    _loop(s, edits, optim_args, sched_args, line_of)
    if multi and s.loop is not None and s.loop.batch is not None and \
            needs_import(s, "torch"):
        imports.insert(0, "import torch")
    add_imports(s, edits, imports)
    return edits


def _dict(model: str | None, kwargs: list[tuple[str, str]]) -> str:
    items = ([f"'params': {model}.parameters()"] if model else []) + \
        [f"{k!r}: {v}" for k, v in kwargs]
    return "{" + ", ".join(items) + "}"


def _wrap(s: Script, edits: Edits, args: str | None, line_of: LineOf) -> None:
    """The PerforatedAI recipe's conditional DataParallel/DDP wrap, the user's arguments kept."""
    wrap = s.wrap
    call = wrap.call
    ddp = wrap.kind == "DistributedDataParallel"
    if ddp:
        true = cst.Name("True")
        new_args = []
        found = False
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "find_unused_parameters":
                arg = arg.with_changes(value=true)
                found = True
            new_args.append(arg)
        if not found:
            new_args.append(cst.Arg(value=true, keyword=cst.Name("find_unused_parameters"),
                                    equal=cst.AssignEqual(cst.SimpleWhitespace(""),
                                                          cst.SimpleWhitespace(""))))
        call = call.with_changes(args=new_args)
    assign = wrap.stmt.body[0]
    new_stmt = wrap.stmt.with_changes(body=[assign.with_changes(value=call)],
                                      leading_lines=[])
    if args is not None:
        text = (WRAP_DDP if ddp else WRAP_DP).format(flag=f"{args}.perforate_model_parallel")
        if wrap.target != s.model_var:  # the initialization run trains the bare model
            text += f"else:\n    {wrap.target} = {s.model_var}\n"
        template = statements(text)
    else:  # no flags here: wrap as in the recipe's normal training mode
        template = statements("GPA.pai_tracker.initialize_tracker_settings()\n__perfora_wrap__")

    class Put(cst.CSTTransformer):
        def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine,
                                      updated: cst.SimpleStatementLine
                                      ) -> cst.SimpleStatementLine:
            if code(original).strip().endswith("__perfora_wrap__"):
                return new_stmt.with_changes(leading_lines=original.leading_lines)
            return updated

    edits.replace_with(wrap.stmt, [st.visit(Put()) for st in template])
    note_done(s.findings, line_of(wrap.stmt), f"{wrap.kind} wrap kept with its arguments"
              + (", find_unused_parameters=True added" if ddp else "")
              + ", inside the PerforatedAI recipe's initialization-run condition")


def _batch(s: Script, edits: Edits, opts: ConvertOptions, imports: list[str], line_of: LineOf,
           new_args: str | None) -> None:
    """DP/DDP: zero-filled gradients before backward(); the initialization run's exit."""
    if s.wrap is None or s.loop is None or s.loop.batch is None:
        return
    batch = s.loop.batch
    head = PRE_INIT_DDP if s.wrap.kind.startswith("Distributed") else PRE_INIT_DP
    if batch.model_name is None:
        s.findings.append(Finding(line_of(batch.backward), "add the PerforatedAI recipe's gradient "
                                  "pre-initialization (for param in model.parameters(): ...) "
                                  "between zero_grad() and this backward() by hand: the "
                                  "model's name here is unknown", MANUAL))
    else:
        pre = with_blank_line(statements(head + PRE_INIT.format(model=batch.model_name)))
        if batch.zero_grad is not None:
            edits.insert_after(batch.zero_grad, pre)
        else:
            edits.insert_before(batch.backward, pre)
        note_done(s.findings, line_of(batch.backward), "zero-filled gradients before "
                  "backward() (the PerforatedAI recipe's DDP fix; harmless with perfora)")
    args_name = batch.args_name or new_args  # a parser perfora added is module-level
    if args_name is not None:
        flag = f"{args_name}.perforate_model_parallel"
    else:
        flag = "'--perforate_model_parallel' in sys.argv"
        if needs_import(s, "sys"):
            imports.insert(0, "import sys")
    edits.insert_after(batch.backward, with_blank_line(statements(
        INIT_EXIT.format(flag=flag, save=opts.save_name))))


def _loop(s: Script, edits: Edits, optim_args: str, sched_args: str, line_of: LineOf) -> None:
    loop = s.loop
    if loop is None:
        return
    target = s.wrap.target if s.wrap is not None else s.model_var
    restructured, complete = s.unique("restructured"), s.unique("training_complete")
    lines = [f"{target}, {restructured}, {complete} = "
             f"GPA.pai_tracker.add_validation_score({loop.score}, {target})",
             f"if {complete}:", "    break"]
    if s.optimizer is not None:
        site = s.optimizer
        opt, sched = opt_names(s)
        call_args = f"{target}, {optim_args}" + (f", {sched_args}" if site.sched_cls else "")
        lines += [f"elif {restructured}:",
                  f"    {optim_args} = {_dict(target, site.opt_kwargs)}",
                  f"    {opt}, {sched} = GPA.pai_tracker.setup_optimizer({call_args})"]
    edits.insert_after(loop.last, with_blank_line(statements("\n".join(lines))))
    for stmt in loop.sched_steps:
        edits.remove(stmt)
        note_done(s.findings, line_of(stmt), "removed the scheduler step: the tracker steps "
                  "the scheduler once per epoch")
    if s.optimizer is None:
        s.findings.append(Finding(line_of(loop.node), f"after `{restructured}` (added after "
                                  "this loop's body) set up the optimizer(s) again by hand: "
                                  "perfora could not register them", MANUAL))
