"""The package's layout stays walkable: imports run one way, from the bottom floor up, with no
circle; few modules sit flat in ``perfora/``; no module or class grows past a screenful or
two. A newcomer who follows one call then never has to climb back up."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "perfora"

FLOORS = {
    "perfora._version": 0, "perfora.errors": 0, "perfora.warn": 0,
    "perfora.nn": 1,
    "perfora.distributed": 2,
    "perfora.checkpoint": 3, "perfora.rules": 3,
    "perfora.parallel": 4, "perfora.config": 4, "perfora.config_values": 4,
    "perfora.growth": 5,
    "perfora.integrations": 6, "perfora.compat": 6,
    "perfora.codemod": 7,
    "perfora.cli": 8, "perfora.__main__": 8,
}
"""The floor of each part (docs/design.md): a module may import its own floor and below."""

MAX_FLAT_MODULES = 8
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 350


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every perfora module ``name`` imports, at any depth of the file (lazy and
    type-checking imports included), resolved to a module of the package."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix
                       for a in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target.startswith("perfora") and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _floor(name: str) -> int | None:
    while name:
        if name in FLOORS:
            return FLOORS[name]
        name = name.rpartition(".")[0]
    return None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_floor() -> None:
    unplaced = [name for name in _modules() if name != "perfora" and _floor(name) is None]
    assert not unplaced, f"modules outside every floor of the layout: {unplaced}"


def test_no_import_circle() -> None:
    assert _cycles(_graph()) == []


def test_no_import_runs_back_up() -> None:
    upward = [f"{name} (floor {_floor(name)}) imports {target} (floor {_floor(target)})"
              for name, targets in _graph().items() if name != "perfora"
              for target in sorted(targets)
              if _floor(target) is not None and _floor(name) is not None
              and _floor(target) > _floor(name)]
    assert not upward, "\n".join(upward)


def test_few_modules_sit_flat_in_the_package() -> None:
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= MAX_FLAT_MODULES, flat


@pytest.mark.parametrize("limit_kind", ["module", "class"])
def test_no_module_or_class_is_oversized(limit_kind: str) -> None:
    too_long = []
    for name, path in _modules().items():
        text = path.read_text()
        if limit_kind == "module":
            lines = len(text.splitlines())
            if lines > MAX_MODULE_LINES:
                too_long.append(f"{name}: {lines} lines")
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    too_long.append(f"{name}.{node.name}: {lines} lines")
    assert not too_long, too_long
