"""``--set NAME=VALUE``: PerforaConfig overrides on a benchmark's command line.

Values are read as JSON where they parse (``2``, ``0.5``, ``true``, ``"random"``) and kept as
text otherwise, so ``--set neuron_init=random`` and ``--set grow_fraction=0.5`` both work.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_set_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """The repeatable ``--set NAME=VALUE`` option."""
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help=help)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_settings(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, Any]:
    """The overrides named by ``--set`` items; a malformed item is a usage error."""
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set {item!r}: expected NAME=VALUE")
        settings[key] = _value(value)
    return settings
