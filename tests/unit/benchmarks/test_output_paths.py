"""Running a benchmark leaves the checkout clean.

By default every benchmark writes to a git-ignored folder (benchmarks/results/local/); only
``--update-stored`` writes the stored results in benchmarks/results/, the tracked files that
benchmarks/README.md's tables are made from.
"""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.paths import ROOT

BENCHMARKS = ROOT / "benchmarks"
# every script with a command line that writes results (tables.py writes README.md's tables
# from the stored results, by design)
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py")
                 if "ArgumentParser(" in p.read_text() and p.stem != "tables")
EXTRA_ARGS = {"gpu_bench": ["--device", "cpu"]}  # the CPU dry run: no CUDA query
NOT_STORED_YET = {"gpu_bench", "zoo"}  # not run yet (on a GPU; at real size): no stored file
NO_STORED_FLAG = {"gpu_check",  # its stored JSON is put together by hand from several runs
                  "model_sweep"}  # its stored JSON is a GPU machine's run, copied by hand


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


pytestmark = pytest.mark.skipif(_git("rev-parse", "--git-dir").returncode != 0,
                                reason="needs a git checkout of perfora")


@functools.cache
def load(name: str) -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # as when run as a script: its siblings import
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def output(name: str, *args: str) -> Path:
    module = load(name)
    parsed = module.build_parser().parse_args([*EXTRA_ARGS.get(name, []), *args])
    return module.output_path(parsed).resolve()


def test_every_benchmark_script_is_checked() -> None:
    assert {"overhead", "quality", "heldout", "ddp", "memory", "gpu_check"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_by_default_a_benchmark_writes_where_git_ignores_it(name: str) -> None:
    path = output(name)
    assert path.is_relative_to(BENCHMARKS / "results" / "local"), path
    assert _git("check-ignore", "-q", str(path)).returncode == 0, f"{path} is not ignored"


@pytest.mark.parametrize("name", sorted(set(SCRIPTS) - NO_STORED_FLAG))
def test_update_stored_writes_the_stored_results(name: str) -> None:
    path = output(name, "--update-stored")
    assert path.parent == BENCHMARKS / "results", path
    assert _git("check-ignore", "-q", str(path)).returncode == 1
    if name not in NOT_STORED_YET:  # the very file README.md's tables are made from
        assert _git("ls-files", "--error-unmatch", str(path)).returncode == 0, path


@pytest.mark.parametrize(("name", "args", "stored"), [
    ("overhead", ["--floor"], "overhead_floor.json"),
    ("overhead", ["--compile"], "overhead_compiled.json"),
    ("overhead", ["--unfused"], "overhead_unfused.json"),
    ("quality", ["--quick"], "quality_quick.json"),
    ("overhead", ["--quick"], "overhead_quick.json"),
    ("overhead", ["--floor", "--quick"], "overhead_floor_quick.json"),
])
def test_variants_keep_their_own_stored_file(name: str, args: list[str], stored: str) -> None:
    assert output(name, *args).name == stored
    assert output(name, *args, "--update-stored") == BENCHMARKS / "results" / stored


def test_an_explicit_path_wins(tmp_path: Path) -> None:
    assert output("ddp", "--out", str(tmp_path / "d.json")) == tmp_path / "d.json"
    assert output("heldout", "--json", str(tmp_path / "h.json"), "--update-stored") \
        == tmp_path / "h.json"


def test_quality_summarize_writes_beside_the_run_not_over_the_stored_json() -> None:
    stored = BENCHMARKS / "results" / "quality.json"
    path = output("quality", "--summarize", str(stored))
    assert path == BENCHMARKS / "results" / "local" / "quality.json"
