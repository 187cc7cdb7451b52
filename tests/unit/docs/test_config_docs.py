"""The settings reference of the docs is generated from PerforaConfig and covers every field."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re

import perfora
from tests.support.paths import ROOT


def _generator():
    spec = importlib.util.spec_from_file_location("gen_settings", ROOT / "docs" / "gen_settings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(page: str) -> dict[str, list[str]]:
    rows = {}
    for line in page.splitlines():
        match = re.match(r"\| `(\w+)` \| (.*) \|$", line)
        if match:
            # cells: code spans (which may hold a pipe), escaped pipes, other text
            rows[match.group(1)] = re.findall(r"(?:`[^`]*`|\\\||[^|`])+", match.group(2))
    return rows


def test_every_setting_is_in_the_generated_page() -> None:
    gen = _generator()
    page = gen.render((ROOT / "docs" / "settings.md").read_text())
    assert gen.MARKER not in page
    rows = _rows(page)
    fields = dataclasses.fields(perfora.PerforaConfig)
    assert [f.name for f in fields] == list(rows)  # every field, in the class's order
    for field in fields:
        _kind, default, meaning = (cell.strip() for cell in rows[field.name])
        assert meaning and meaning != "(undocumented)", f"{field.name} has no docstring"
        shown = ast.literal_eval(default.strip("`"))
        expected = (field.default_factory() if field.default_factory is not dataclasses.MISSING
                    else field.default)
        assert shown == expected, field.name


def test_docstrings_become_markdown_cells() -> None:
    rows = _rows(_generator().settings_table())
    meaning = rows["improvement_threshold"][2]
    assert "\\|best\\|" in meaning  # a pipe in the text does not split the table's row
    assert "``" not in "".join(cell for row in rows.values() for cell in row)
