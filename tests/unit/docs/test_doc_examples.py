"""The code the docs show names perfora's API as it is: a renamed function, a removed setting
or a keyword the call does not take fails here, not in a newcomer's first hour.

Most Python blocks in the docs are fragments (they use a ``model`` or a ``trainer`` built
elsewhere), so they are checked, not run: each parses; each ``perfora.<name>`` written in the
docs (code or prose) resolves; each keyword given to a perfora call in a block is one the call
takes (for the controller and the config: a ``PerforaConfig`` setting). The complete examples
run in their own tests (``examples/``).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

import perfora
from tests.support.paths import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md",
                *(ROOT / "docs").glob("*.md")])
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
DOTTED_NAME = re.compile(r"(?<![\w/.-])perfora(?:\.[A-Za-z_]\w*)+")
FILE_NAMES = {"perfora.json", "perfora.safetensors"}  # files a run writes, not API names
SETTINGS = {f.name for f in dataclasses.fields(perfora.PerforaConfig)}
TAKES_SETTINGS = {"GrowthController", "PerforaConfig"}


def _blocks() -> list[tuple[str, str]]:
    return [(f"{page.relative_to(ROOT)}#{i}", textwrap.dedent(block))
            for page in PAGES
            for i, block in enumerate(PYTHON_BLOCK.findall(page.read_text()))]


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    obj = perfora
    for i, name in enumerate(parts[1:], start=1):
        if hasattr(obj, name):
            obj = getattr(obj, name)
            continue
        try:
            obj = importlib.import_module(".".join(parts[:i + 1]))
        except ImportError:
            return False
    return True


def _unknown_keywords(tree: ast.AST) -> list[str]:
    """``name(kw=...)`` for perfora calls in ``tree`` whose keyword the callee does not take."""
    wrong = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and func.value.id == "perfora":
            name = func.attr
        elif isinstance(func, ast.Name):
            name = func.id
        else:
            continue
        target = getattr(perfora, name, None)
        if target is None or name.startswith("_"):
            continue
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):
            continue
        open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for keyword in node.keywords:
            if keyword.arg is None or keyword.arg in params:
                continue
            if name in TAKES_SETTINGS and keyword.arg in SETTINGS:
                continue
            if open_ended and name not in TAKES_SETTINGS:
                continue
            wrong.append(f"{name}({keyword.arg}=...)")
    return wrong


BLOCKS = _blocks()


def test_the_docs_show_python_examples() -> None:
    assert len(BLOCKS) >= 20  # the check below would pass vacuously if the pattern broke


@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_each_python_block_parses_and_calls_perfora_with_real_keywords(where: str,
                                                                        code: str) -> None:
    tree = ast.parse(code, filename=where)
    assert _unknown_keywords(tree) == [], where


def test_every_perfora_name_in_the_docs_exists() -> None:
    missing = sorted({(match, str(page.relative_to(ROOT)))
                      for page in PAGES
                      for match in DOTTED_NAME.findall(page.read_text())
                      if match not in FILE_NAMES and not _resolves(match)})
    assert missing == []


def test_the_checks_catch_a_renamed_function_and_a_wrong_keyword() -> None:
    assert not _resolves("perfora.grow_dendrites_now")
    assert _resolves("perfora.GrowthController.from_checkpoint")
    tree = ast.parse("perfora.GrowthController(model, patience=3, maximize=True)\n"
                     "perforate(model, paths=['0'], verbose=True, depth=2)")
    assert _unknown_keywords(tree) == ["GrowthController(patience=...)", "perforate(depth=...)"]


def test_the_pages_are_found() -> None:
    assert Path(ROOT / "docs" / "quickstart.md") in PAGES
