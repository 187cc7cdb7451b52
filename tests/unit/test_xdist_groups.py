"""The suite's xdist groups hold: tests marked with one ``xdist_group`` run on one worker, so a
module's shared session fixture (a distributed run of many seconds) runs once, not once per
worker. pytest 9.2 with pytest-xdist 3.8 drops the groups silently, and every grouped
fixture then runs twice (the dev extra keeps pytest below 9.2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

GROUPED = '''
import os
import time

import pytest

pytestmark = pytest.mark.xdist_group("one")


@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    time.sleep(0.1)
    with open(os.environ["WORKERS_FILE"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
'''


@pytest.mark.timeout(120)
def test_the_tests_of_one_xdist_group_run_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    workers = tmp_path / "workers.txt"
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTEST_", "COV_"))}
    env["WORKERS_FILE"] = str(workers)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # xdist alone: the other plugins cost seconds
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "xdist", "-p", "no:cacheprovider", "-q", "-n", "2",
         "--dist", "loadgroup", "test_grouped.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    ran_on = workers.read_text().split()
    assert len(ran_on) == 6
    assert len(set(ran_on)) == 1, f"one group ran on workers {sorted(set(ran_on))}"
