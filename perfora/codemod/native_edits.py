"""Native mode: the script uses perfora's own API (perforate, GrowthController, step()).

No restart, no initialization run, no find_unused_parameters, no zero-filled gradients:
a DataParallel/DDP wrapper is kept as the user built it and re-wrapped by the controller.
"""

from __future__ import annotations

import libcst as cst

from .analysis import LineOf, Script
from .common import ConvertOptions, add_flags, add_imports, maximize_of, note_done, opt_names
from .edits import Edits, statements, with_blank_line
from .findings import MANUAL, Finding

RESUME_FLAG = "--perfora_resume"


def native_edits(script: Script, opts: ConvertOptions, line_of: LineOf) -> Edits:
    """The edits that convert ``script`` to perfora's native API."""
    edits = Edits()
    s = script
    if s.insert_at is None:
        return edits
    imports = ["import perfora"]
    x = s.model_var
    ctl, dec = s.unique("controller"), s.unique("decision")
    maximize = maximize_of(s, opts)
    given = {"maximize": str(maximize), **opts.settings}  # a maximize given there wins
    config = ", ".join(f"{k}={v}" for k, v in given.items())
    run_dir = opts.run_dir or f"perfora_runs/{opts.name}"
    block = [
        f"{x} = perfora.perforate({x})  # perfora: layers that can grow dendrites",
        f"{ctl} = perfora.GrowthController(",
        f"    {x}, perfora.PerforaConfig({config}),",
        f"    run_dir={run_dir!r})",
    ]
    if s.optimizer is not None:
        site = s.optimizer
        opt, sched = opt_names(s)
        kwargs = "".join(f", {k}={v}" for k, v in site.opt_kwargs)
        block.append(f"{ctl}.set_optimizer({site.opt_cls}{kwargs})  "
                     + (site.opt_comment or "# rebuilt after restructures"))
        if site.sched_cls is not None:
            skw = "".join(f", {k}={v}" for k, v in site.sched_kwargs)
            block.append(f"{ctl}.set_scheduler({site.sched_cls}{skw})  "
                         + (site.sched_comment or f"# stepped by {ctl}.step()"))
        args = add_flags(s, edits, [(RESUME_FLAG, "type=str, default=None, help='resume a "
                                     "perfora run: latest, best, switch_N or a checkpoint "
                                     "path'")], imports)
        if args is not None:
            _skip_done_epochs(s, edits, ctl)
            block += [
                f"if {args}.perfora_resume:  # continue a perfora run where it stopped",
                f"    {dec} = {ctl}.load({args}.perfora_resume)",
                f"    {opt}, {sched} = {dec}.optimizer, {dec}.scheduler" if sched != "_"
                else f"    {opt} = {dec}.optimizer",
                "else:",
                f"    {opt}, {sched} = {ctl}.build_optimizer()",
            ]
        else:
            block.append(f"{opt}, {sched} = {ctl}.build_optimizer()")
        for stmt in site.stmts:
            edits.remove(stmt, keep_comments=False)  # they are on the new lines
    edits.insert_before(s.insert_at, with_blank_line(statements("\n".join(block))))
    note_done(s.findings, line_of(s.insert_at), f"perforated `{x}` and created the growth "
              f"controller (run files in {run_dir}/)")
    _loop(s, edits, ctl, dec, line_of)
    add_imports(s, edits, imports)
    return edits


def _loop(s: Script, edits: Edits, ctl: str, dec: str, line_of: LineOf) -> None:
    loop = s.loop
    if loop is None:
        return
    wrap = s.wrap
    model_arg = f", model={wrap.target}" if wrap is not None else ""
    lines = [f"{dec} = {ctl}.step({loop.score}{model_arg})  # perfora: once per epoch"]
    refresh = []
    if s.optimizer is not None:
        opt, sched = opt_names(s)
        refresh.append(f"    {opt}, {sched} = {dec}.optimizer, {dec}.scheduler" if sched != "_"
                       else f"    {opt} = {dec}.optimizer")
    if wrap is not None:
        lines.append(f"if {dec}.restructured or {dec}.complete:  # a new {wrap.kind}, "
                     "same arguments")
        lines.append(f"    {wrap.target} = {dec}.model")
        lines += refresh
    elif refresh:
        lines.append(f"if {dec}.restructured:  # dendrites added: a new optimizer")
        lines += refresh
    lines += [f"if {dec}.complete:  # the model now holds its best weights", "    break"]
    edits.insert_after(loop.last, with_blank_line(statements("\n".join(lines))))
    for stmt in loop.sched_steps:
        edits.remove(stmt)
        note_done(s.findings, line_of(stmt), "removed the scheduler step: "
                  f"{ctl}.step() steps the scheduler once per epoch")
    if s.optimizer is None:
        s.findings.append(Finding(line_of(loop.node), f"after `{dec}.restructured` (added "
                                  "after this loop's body) build the optimizer(s) again over "
                                  "model.parameters() by hand: perfora could not register "
                                  "them", MANUAL))


def _skip_done_epochs(s: Script, edits: Edits, ctl: str) -> None:
    """A resumed run goes on at the controller's epoch: the epoch loop (``for epoch in
    range(...)``) skips the epochs already done, so the epoch numbers (a sampler's
    ``set_epoch``, a schedule keyed on them) are the uninterrupted run's."""
    loop = s.loop
    node = loop.node if loop is not None else None
    if not isinstance(node, cst.For) or not isinstance(node.target, cst.Name) \
            or not isinstance(node.body, cst.IndentedBlock) or not node.body.body:
        return
    call = node.iter
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)
            and call.func.value == "range" and 1 <= len(call.args) <= 2):
        return
    start = cst.Module([]).code_for_node(call.args[0].value) if len(call.args) == 2 else "0"
    done = f"{ctl}.epoch" if start == "0" else f"{start} + {ctl}.epoch"
    edits.insert_before(node.body.body[0], statements(
        f"if {node.target.value} < {done}:  # perfora: done before the run was resumed\n"
        "    continue"))
