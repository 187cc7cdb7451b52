"""Read a training script: where the model, optimizer, scheduler, wrapper, argparse and loops
are, with line numbers, and what is too irregular to change safely.

Each part is found by one finder in :mod:`perfora.codemod.finders`, which returns what it
found and its findings; :func:`find_parts` runs them in dependency order and gathers the
:class:`Script` both modes' transforms consume. Nothing here edits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from .finders.arguments import ArgParse, args_visible, find_argparse
from .finders.batch import BatchSite, find_batch
from .finders.imports import already_converted, last_import
from .finders.loop import Loop, find_epoch_loop
from .finders.optimizer import OptimizerSite, find_optimizer
from .finders.placement import find_placement
from .finders.score import find_score
from .finders.steps import find_scheduler_steps
from .finders.tree import Tree
from .finders.wrap import Wrap, find_wrap
from .findings import Finding

__all__ = ["Script", "analyze", "find_parts", "Analyzer", "LineOf", "ArgParse", "BatchSite",
           "Loop", "OptimizerSite", "Wrap"]

LineOf = Callable[[cst.CSTNode], int]
"""How transforms ask for a node's line number (for their notes)."""


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


def analyze(source: str, score: str | None = None) -> Script:
    """Parse ``source`` (libcst, keeping every comment and blank line) and find its parts."""
    return find_parts(Tree(source), score)


def find_parts(tree: Tree, score: str | None = None) -> Script:
    """Run the finders in dependency order (``score``: the user's --score); the script.

    A script that already calls perfora (or PerforatedAI's API) is only marked ``already``.
    """
    already = already_converted(tree)
    if already:
        return Script(tree.module, [], tree.aliases, tree.names, already=already)
    findings: list[Finding] = []
    argparse, found = find_argparse(tree)
    findings += found
    optimizers = find_optimizer(tree)
    findings += optimizers.findings
    site, model = optimizers.site, optimizers.model
    model_var = scope = wrap = insert_at = loop = None
    if model is not None:
        scope = model.scope
        wrap, model_var, found = find_wrap(tree, model.model_var, scope)
        findings += found
        placed = find_placement(tree, model, model_var, wrap, site)
        findings += placed.findings
        insert_at = placed.insert_at
        site = site if placed.keep_optimizer else None
    if insert_at is not None:
        loop, site, found = _find_loop(tree, insert_at, site, model_var, scope, wrap,
                                       argparse, score)
        findings += found
    visible, found = args_visible(tree, argparse, scope, insert_at)
    findings += found
    return Script(tree.module, findings, tree.aliases, tree.names,
                  last_import=last_import(tree.module), argparse=argparse, model_var=model_var,
                  scope=scope, insert_at=insert_at, optimizer=site, wrap=wrap, loop=loop,
                  args_visible=visible)


def _find_loop(tree: Tree, insert_at: cst.BaseStatement, site: OptimizerSite | None,
               model_var: str, scope: cst.FunctionDef | None, wrap: Wrap | None,
               argparse: ArgParse | None, score: str | None
               ) -> tuple[Loop | None, OptimizerSite | None, list[Finding]]:
    """The epoch loop with its score, scheduler steps and batch; the optimizer site, None
    when the scheduler steps every batch; the findings."""
    epoch, findings = find_epoch_loop(tree, scope, insert_at)
    if epoch is None:
        return None, site, findings
    steps: list[cst.BaseStatement] = []
    if site is not None:
        stepping = find_scheduler_steps(tree, epoch.node, epoch.backward, site)
        findings += stepping.findings
        steps = stepping.remove
        if stepping.per_batch:
            site, steps = None, []
    name, found = find_score(tree, epoch.node, site, score)
    findings += found
    if name is None:
        return None, site, findings
    batch = find_batch(tree, epoch.backward, epoch.node, scope, model_var, wrap, argparse)
    return Loop(epoch.node, epoch.node.body.body[-1], name, steps, batch), site, findings


class Analyzer(Tree):
    """A parsed script whose :meth:`run` finds its parts (``score``: the user's --score)."""

    def __init__(self, source: str, score: str | None = None) -> None:
        """Parse ``source`` (raises ``libcst.ParserSyntaxError``); nothing is found yet."""
        super().__init__(source)
        self.score_name = score

    def run(self) -> Script:
        """The script's parts and findings (:func:`find_parts`)."""
        return find_parts(self, self.score_name)
