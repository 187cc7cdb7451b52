"""``--set NAME=VALUE``: PerforaConfig overrides on a benchmark's command line.

Values are read as JSON where they parse (``2``, ``0.5``, ``true``, ``"random"``) and kept as
text otherwise, so ``--set neuron_init=random`` and ``--set grow_fraction=0.5`` both work.
"""

from __future__ import annotations

import argparse
from typing import Any

from perfora.config_values import parse_overrides
from perfora.errors import ConfigError


def add_set_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """The repeatable ``--set NAME=VALUE`` option."""
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help=help)


def parse_settings(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, Any]:
    """The overrides named by ``--set`` items (perfora's own reading, as ``perfora demo
    --set``); a malformed item is a usage error."""
    try:
        return parse_overrides(items)
    except ConfigError as exc:
        parser.error(f"{exc} (expected NAME=VALUE)")
