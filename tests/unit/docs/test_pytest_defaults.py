"""What the README promises about `pytest -q`: a skipped test shows its reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT


def test_pytest_q_with_the_project_options_prints_each_skip_reason(tmp_path: Path) -> None:
    (tmp_path / "test_needs_root.py").write_text(
        "import pytest\n\n\ndef test_two_nodes():\n"
        "    pytest.skip('needs root to create network namespaces')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-n", "0",
         str(tmp_path / "test_needs_root.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SKIPPED [1]" in proc.stdout
    assert "needs root to create network namespaces" in proc.stdout
