"""The results tables in benchmarks/README.md are the ones the stored JSON gives."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT


def test_benchmark_tables_match_the_json() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tables.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
