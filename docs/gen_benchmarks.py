"""MkDocs hook: the benchmarks page, built from benchmarks/README.md.

The results live next to the benchmarks (``benchmarks/README.md``, whose tables
``benchmarks/tables.py`` regenerates from ``benchmarks/results/*.json``). MkDocs reads only
``docs/``, so this hook adds that file to the site as ``benchmarks.md``, with the plots it
shows (``results/*.png``), and turns its links into the docs (``../docs/PAGE.md``) into links
between pages. Nothing is copied into the source tree.

The pages link to the file itself, ``../benchmarks/README.md`` (a link that works when the
docs are read in the repository, on GitHub or in an editor); on the site those links are
turned into links to the generated ``benchmarks.md`` page.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
PAGE = "benchmarks.md"


def page_markdown() -> str:
    """benchmarks/README.md as a page of the site."""
    text = (BENCHMARKS / "README.md").read_text()
    return re.sub(r"\]\(\.\./docs/", "](", text)


def site_links(markdown: str) -> str:
    """A docs page's links to ``../benchmarks/README.md`` as links to the site's page."""
    return re.sub(r"\]\(\.\./benchmarks/README\.md(?=[#)])", "](" + PAGE, markdown)


def images(markdown: str) -> list[str]:
    """The ``results/...`` files the page shows, relative to benchmarks/."""
    return sorted(set(re.findall(r"\]\((results/[^)\s]+\.(?:png|svg|jpg))\)", markdown)))


def on_files(files: Any, config: Any, **_: Any) -> Any:
    """MkDocs hook: add the benchmarks page and its plots."""
    from mkdocs.structure.files import File

    markdown = page_markdown()
    files.append(File.generated(config, PAGE, content=markdown))
    for rel in images(markdown):
        files.append(File.generated(config, rel, abs_src_path=str(BENCHMARKS / rel)))
    return files


def on_config(config: Any, **_: Any) -> Any:
    """MkDocs hook: rebuild while serving when the benchmarks' README or plots change."""
    watch = config.get("watch")
    if watch is not None and str(BENCHMARKS) not in map(str, watch):
        watch.append(str(BENCHMARKS))
    return config


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: links to benchmarks/README.md lead to the benchmarks page of the site."""
    return site_links(markdown)
