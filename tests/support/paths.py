"""Where the suite's files live, so that tests in any folder find the shared scripts."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SCRIPTS = TESTS / "scripts"
