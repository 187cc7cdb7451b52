"""Pieces both modes share: options, settings, imports, argparse flags, score direction."""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass, field

import libcst as cst

from ..errors import ConfigError
from .analysis import Script
from .edits import Edits, statements
from .finders.score import MINIMIZE
from .findings import NOTE, Finding
from .syntax import code

MODES = ("native", "compat")
COMPAT_SWITCH_MODES = {"patience": "DOING_HISTORY", "history": "DOING_HISTORY",
                       "fixed": "DOING_FIXED_SWITCH", "every_epoch": "DOING_SWITCH_EVERY_TIME",
                       "never": "DOING_NO_SWITCH"}


@dataclass
class ConvertOptions:
    """How to convert: the mode and the few choices a script cannot tell the converter."""

    mode: str = "native"
    settings: dict[str, str] = field(default_factory=dict)
    run_dir: str | None = None
    save_name: str = "PAI"
    score: str | None = None
    maximize: bool | None = None
    name: str = "train"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}: use 'native' (perfora's API, no "
                              "restarts) or 'compat' (the PerforatedAI recipe)")
        self.settings = {k: _setting_source(self.mode, k, v) for k, v in self.settings.items()}
        _check_values(self.mode, self.settings)


def _suggestion(name: str, known: list[str]) -> str:
    """'; did you mean X?' as PerforaConfig says it, else the names to choose from."""
    from ..config import ALIASES, nearest_name

    alias = ALIASES.get(name)
    close = alias if alias in known else nearest_name(name, known)
    return f"; did you mean {close!r}?" if close else f"; known: {', '.join(sorted(known))}"


def _setting_source(mode: str, name: str, value: str) -> str:
    """Check a --set NAME=VALUE against the mode's settings; the value as Python source."""
    if mode == "native":
        from ..config import PerforaConfig

        known = [f.name for f in dataclasses.fields(PerforaConfig) if f.name != "extra"]
    else:
        from ..compat.settings import SETTINGS

        known = list(SETTINGS)
    if name not in known:
        raise ConfigError(f"--set {name}: not a {mode}-mode setting{_suggestion(name, known)}")
    text = str(value).strip()
    bare = text.strip("'\"")
    if mode == "compat" and name == "switch_mode" and bare in COMPAT_SWITCH_MODES:
        return f"GPA.pc.{COMPAT_SWITCH_MODES[bare]}"
    if mode == "compat" and name == "switch_mode" and bare in COMPAT_SWITCH_MODES.values():
        return f"GPA.pc.{bare}"
    if text.isidentifier() and text not in ("True", "False", "None"):
        return repr(text)  # a bare word is a string setting: switch_mode=fixed
    try:
        cst.parse_expression(text)
    except cst.ParserSyntaxError as exc:
        raise ConfigError(f"--set {name}={value}: not a Python value ({exc.message})") from None
    return text


def _check_values(mode: str, settings: dict[str, str]) -> None:
    """Catch out-of-range literal values now rather than when the script runs."""
    values = {}
    for name, text in settings.items():
        try:
            values[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            continue  # an expression of the script (args.x): checked when it runs
    if not values:
        return
    if mode == "native":
        from ..config import PerforaConfig

        try:
            PerforaConfig(**values)
        except (ConfigError, TypeError) as exc:
            raise ConfigError(f"--set: {exc}") from None
    else:
        from ..compat.settings import PAISettings

        pc = PAISettings()
        for name, value in values.items():
            pc.set(name, value)


def maximize_of(script: Script, opts: ConvertOptions) -> bool:
    """Whether the reported score is maximized: option, ReduceLROnPlateau mode, or its name."""
    if opts.maximize is not None:
        return opts.maximize
    site = script.optimizer
    if site is not None and site.plateau_mode in ("min", "max"):
        return site.plateau_mode == "max"
    score = script.loop.score if script.loop is not None else ""
    return not (score and MINIMIZE.search(score))


def add_imports(script: Script, edits: Edits, lines: list[str]) -> None:
    """Insert import lines after the script's imports (or at its top)."""
    stmts = statements("\n".join(lines))
    if script.last_import is not None:
        edits.insert_after(script.last_import, stmts)
        return
    body = list(script.module.body)
    for stmt in body:
        docstring = isinstance(stmt, cst.SimpleStatementLine) and isinstance(
            stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.SimpleString)
        future = isinstance(stmt, cst.SimpleStatementLine) and isinstance(
            stmt.body[0], cst.ImportFrom) and code(stmt).lstrip().startswith("from __future__")
        if not docstring and not future:
            edits.insert_before(stmt, stmts)
            return


def needs_import(script: Script, name: str) -> bool:
    """True when ``import name`` is missing."""
    return script.aliases.get(name) != name


def add_flags(script: Script, edits: Edits, flags: list[tuple[str, str]],
              imports: list[str]) -> str | None:
    """Add ``--flag`` arguments (name, add_argument's other arguments); the args name.

    Into the script's own parser, just before it parses; without argparse, a new
    module-level parser that ignores arguments it does not know. None when not possible.
    """
    ap = script.argparse
    if ap is not None:
        if ap.parse_stmt is None or ap.parser_var is None or ap.args_var is None \
                or not script.args_visible:
            return None
        new = [_flag_line(ap.parser_var, flag, rest) for flag, rest in flags
               if flag not in ap.existing_flags]
        if new:
            edits.insert_before(ap.parse_stmt, statements("\n".join(new)))
        return ap.args_var
    parser, args = script.unique("parser"), script.unique("args")
    if needs_import(script, "argparse"):
        imports.append("import argparse")
    lines = ["", f"{parser} = argparse.ArgumentParser()"]
    lines += [_flag_line(parser, flag, rest) for flag, rest in flags]
    lines.append(f"{args}, _ = {parser}.parse_known_args()")
    imports.extend(lines)
    return args


def _flag_line(parser: str, flag: str, rest: str) -> str:
    """``parser.add_argument('--flag', ...)``, its help text on a continuation line."""
    head = f"{parser}.add_argument({flag!r}, "
    options, sep, help_text = rest.partition(", help=")
    if not sep:
        return f"{head}{rest})"
    return f"{head}{options},\n{' ' * len(parser)}              help={help_text})"


def opt_names(script: Script) -> tuple[str, str]:
    """``optimizer, scheduler`` as the left side of an assignment (``_`` without one)."""
    site = script.optimizer
    return site.opt_var, site.sched_var or "_"


def note_done(findings: list[Finding], line: int, message: str) -> None:
    """Record what was changed (a note)."""
    findings.append(Finding(line, message, NOTE))
