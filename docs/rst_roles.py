"""MkDocs hook: reST cross-reference roles in docstrings shown as plain code.

perfora's docstrings mark names the reST way (``:class:`~perfora.PerforaConfig```); rendered
as Markdown by mkdocstrings, that reads ":class:" followed by the name. This hook drops the
role (and the leading ``~``) so the API reference shows just the name as code.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj):<code>~?")


def on_page_content(html: str, **_: Any) -> str:
    """MkDocs hook: ``:class:<code>~x.Y</code>`` becomes ``<code>x.Y</code>``."""
    return ROLE.sub("<code>", html)
