"""MkDocs hook: the settings table of docs/settings.md, generated from perfora.PerforaConfig.

Every field of the dataclass becomes one row: its name, type, default and the documentation
written under it in the class body (an attribute docstring, as mkdocstrings reads it). The
page holds the marker ``<!-- settings-table -->`` where the table goes, so the reference can
never drift from the code. ``settings_table()`` is also what the test suite checks.

Run by hand to see the table: ``python docs/gen_settings.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from typing import Any

MARKER = "<!-- settings-table -->"
PAGE = "settings.md"


def _config_class() -> type:
    import perfora  # only through the package root: modules move, public names stay

    return perfora.PerforaConfig


def field_docs(cls: type) -> dict[str, dict[str, str]]:
    """For each annotated field of ``cls``: the default as written and the docstring below it."""
    source = textwrap.dedent(inspect.getsource(cls))
    tree = ast.parse(source)
    body = tree.body[0].body  # the class statement
    out: dict[str, dict[str, str]] = {}
    for stmt, after in zip(body, body[1:] + [None]):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        doc = ""
        if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            doc = inspect.cleandoc(after.value.value)
        default = ast.get_source_segment(source, stmt.value) if stmt.value else ""
        out[stmt.target.id] = {"doc": doc, "default": default or ""}
    return out


def _escape_pipes(text: str) -> str:
    """Escape ``|`` outside code spans (a table cell); code spans keep theirs as they are."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def _markdown(text: str) -> str:
    """A docstring as one table cell: reST ``code`` as Markdown code, pipes escaped."""
    text = " ".join(text.split())
    text = re.sub(r"``(.+?)``", r"`\1`", text)
    text = re.sub(r":(?:class|func|meth|attr|mod):`~?([^`]+)`", r"`\1`", text)
    return _escape_pipes(text)


def _default(field: dataclasses.Field, written: str) -> str:
    if field.default_factory is not dataclasses.MISSING:  # e.g. field(default_factory=dict)
        return f"`{field.default_factory()!r}`"
    if written:
        return f"`{written}`"
    return f"`{field.default!r}`"


def settings_rows() -> list[dict[str, Any]]:
    """One dict per PerforaConfig field: name, type, default (Markdown) and meaning."""
    cls = _config_class()
    docs = field_docs(cls)
    rows = []
    for field in dataclasses.fields(cls):
        info = docs.get(field.name, {"doc": "", "default": ""})
        kind = field.type if isinstance(field.type, str) else getattr(
            field.type, "__name__", str(field.type))
        rows.append({"name": field.name, "type": kind,
                     "default": _default(field, info["default"]),
                     "meaning": _markdown(info["doc"]) or "(undocumented)"})
    return rows


def settings_table() -> str:
    """The Markdown table of every setting."""
    lines = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    for row in settings_rows():
        lines.append(f"| `{row['name']}` | `{row['type']}` | {row['default']} | "
                     f"{row['meaning']} |")
    return "\n".join(lines)


def render(markdown: str) -> str:
    """``markdown`` with the marker replaced by the table (an error if the marker is gone)."""
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its {MARKER} marker")
    return markdown.replace(MARKER, settings_table())


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs hook: fill in the settings page."""
    if page.file.src_uri == PAGE:
        return render(markdown)
    return markdown


if __name__ == "__main__":
    print(settings_table())
