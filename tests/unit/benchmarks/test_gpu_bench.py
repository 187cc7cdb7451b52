"""``benchmarks/gpu_bench.py``: the GPU benchmark's own behaviour, checked without a GPU.

On a machine without CUDA it must refuse with a message that says how to dry-run it; a dry
run on the CPU must produce the JSON the benchmark docs are built from (the overhead rows
for float32 and bf16 autocast, the DDP ratios); and work that does not fit the time budget
must be skipped and recorded, never silently dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.paths import ROOT
from tests.support.script_server import ScriptRun, ScriptServer

SCRIPT = ROOT / "benchmarks" / "gpu_bench.py"


@pytest.fixture
def run(script_server: ScriptServer, tmp_path: Path):
    """``python benchmarks/gpu_bench.py ARGS``, forked from the warm script server."""
    def bench(*args: str, timeout: int = 240) -> ScriptRun:
        return script_server.run(SCRIPT, *args, cwd=tmp_path / "job", timeout=timeout)
    return bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_it_refuses_and_says_how_to_dry_run(run):
    proc = run()
    assert proc.codes == [2]
    assert "no CUDA device" in proc.log() and "--device cpu" in proc.log()


def test_bad_arguments_are_refused_with_the_choices(run):
    proc = run("--device", "cpu", "--parts", "overhead,bogus")
    assert proc.codes == [2]
    assert "unknown part(s) bogus" in proc.log() and "compiled" in proc.log()


def test_work_beyond_the_budget_is_skipped_and_recorded(run, tmp_path):
    out = tmp_path / "gpu.json"
    proc = run("--device", "cpu", "--parts", "compiled,memory", "--budget-s", "0",
               "--out", str(out))
    assert proc.ok, proc.log()[-2000:]
    result = json.loads(out.read_text())
    compiled = result["compiled"]
    assert compiled["rows"] == {"fp32": [], "bf16": []}
    assert len(compiled["skipped"]) == 2 * 3  # two precisions, one group per model
    assert all("time budget" in s["reason"] for s in compiled["skipped"])
    assert "time budget" in result["memory"]["skipped"]


def test_cpu_dry_run_writes_overhead_rows_and_ddp_ratios(run, tmp_path):
    out = tmp_path / "gpu.json"
    proc = run("--device", "cpu", "--quick", "--groups", "1", "--parts", "overhead,ddp",
               "--out", str(out))
    assert proc.ok, proc.log()[-2000:]
    result = json.loads(out.read_text())
    assert result["device_type"] == "cpu" and result["parts"] == ["overhead", "ddp"]
    for precision in ("fp32", "bf16"):
        rows = result["overhead"]["rows"][precision]
        assert [r["K"] for r in rows] == [0, 1, 2, 3]
        for r in rows:
            assert r["precision"] == precision and r["ideal"] == r["K"] + 1
            assert r["ratio"] > 0 and r["repeats"] == 3
            measured = r["ratio"] if r["K"] == 0 else r["measured_over_ideal"]
            assert r["meets_target"] == (measured <= r["target"])
    ddp = result["ddp"]
    assert ddp["backend"] == "gloo" and ddp["ranks"] == 2
    assert [r["K"] for r in ddp["rows"]] == [0, 1, 2, 3]
    assert all(r["ratio"] > 0 for r in ddp["rows"])
