"""Every relative link in the Markdown a user reads in the repository leads somewhere.

README.md, docs/*.md and benchmarks/README.md are read on GitHub (or in an editor) as files,
and the docs are also built as a site. A relative link must name a file of the repository,
and a ``#anchor`` into a Markdown file one of its headings, as GitHub spells heading anchors.
(The site's links and anchors are checked by ``mkdocs build --strict``.)
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md",
                *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"!?\[(?:[^\]`]|`[^`]*`)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
EXTERNAL = ("http://", "https://", "mailto:")


def block_lines(markdown: str) -> list[str]:
    """The lines outside fenced and indented code blocks."""
    lines, fenced, previous_blank = [], False, True
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        indented_code = previous_blank and line.startswith("    ") and bool(line.strip())
        if not fenced and not indented_code:
            lines.append(line)
        previous_blank = not line.strip() or (indented_code and previous_blank)
    return lines


def prose(markdown: str) -> str:
    """The text outside code blocks, with code spans hidden."""
    return re.sub(r"`[^`\n]*`", "code", "\n".join(block_lines(markdown)))


def links(page: Path) -> list[str]:
    """The relative link targets of a page (external and absolute links left out)."""
    return [t for t in LINK.findall(prose(page.read_text()))
            if not t.startswith(EXTERNAL) and not t.startswith("/")]


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (duplicates get -1, -2, ...)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in block_lines(markdown):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1))  # a link: its text
        text = text.replace("`", "").replace("*", "").strip().lower()  # as rendered
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_the_pages_have_links_to_check() -> None:
    assert len(PAGES) > 10
    assert sum(len(links(p)) for p in PAGES) > 50


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_an_existing_file_and_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        path_part, _, anchor = target.partition("#")
        file = (page.parent / path_part).resolve() if path_part else page
        if not file.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text()):
            broken.append(f"{target}: no heading with that anchor in {file.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_docs_link_to_the_benchmarks_file_not_to_the_generated_page() -> None:
    """docs/benchmarks.md exists only on the site: the docs link to benchmarks/README.md."""
    assert not (ROOT / "docs" / "benchmarks.md").exists()
    for page in (ROOT / "docs").glob("*.md"):
        assert not [t for t in links(page) if t.split("#")[0] == "benchmarks.md"], page.name


def test_anchors_are_spelled_as_github_spells_them() -> None:
    page = "# Title\n\n## `perfora demo`\n\n## Learning quality: dendrites or a wider network?\n" \
           "\n## GPU check (one H200)\n\n## Notes\n\n## Notes\n\n    # not a heading\n"
    assert github_anchors(page) == {"title", "perfora-demo", "notes", "notes-1",
                                    "learning-quality-dendrites-or-a-wider-network",
                                    "gpu-check-one-h200"}


def test_on_the_site_those_links_lead_to_the_generated_benchmarks_page() -> None:
    spec = importlib.util.spec_from_file_location("gen_benchmarks",
                                                  ROOT / "docs" / "gen_benchmarks.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "quickstart.md").read_text()
    assert "](../benchmarks/README.md#perfora-demo)" in page
    site = hook.on_page_markdown(page)
    assert "](benchmarks.md#perfora-demo)" in site and "../benchmarks/README.md" not in site
    assert hook.site_links("[b](../benchmarks/README.md)") == "[b](benchmarks.md)"
