"""perfora never unpickles arbitrary objects: every ``torch.load`` in the package passes
``weights_only=True`` (tensors and plain containers only), and nothing calls
``pickle.load``/``pickle.loads`` (DCP's metadata has its own allow-listed unpickler)."""

from __future__ import annotations

import ast
from pathlib import Path

import perfora

PACKAGE = Path(perfora.__file__).parent


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def test_no_source_loads_a_checkpoint_with_weights_only_false():
    offenders = [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
                 if "weights_only=False" in path.read_text()]
    assert offenders == []


def test_every_torch_load_is_restricted_to_weights_and_nothing_calls_pickle_load():
    found, unsafe = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        for call in _calls(ast.parse(path.read_text(), str(path))):
            name = _dotted(call.func)
            where = f"{path.relative_to(PACKAGE)}:{call.lineno}"
            if name in ("pickle.load", "pickle.loads", "dill.load", "dill.loads"):
                unsafe.append(f"{where} {name}")
            elif name == "torch.load":
                found += 1
                flag = next((k.value for k in call.keywords if k.arg == "weights_only"), None)
                if not (isinstance(flag, ast.Constant) and flag.value is True):
                    unsafe.append(f"{where} torch.load without weights_only=True")
    assert unsafe == []
    assert found >= 1  # the Lightning callback's checkpoint reader is among them
