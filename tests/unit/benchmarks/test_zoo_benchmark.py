"""benchmarks/zoo.py --quick runs end to end and writes the fields the docs table reads."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import ROOT

pytest.importorskip("transformers")


@pytest.mark.slow
def test_quick_zoo_benchmark_writes_every_field(tmp_path, script_server):
    out = tmp_path / "zoo.json"
    proc = script_server.run(ROOT / "benchmarks" / "zoo.py", "--quick", "--rounds", "1",
                             "--out", str(out), cwd=tmp_path / "job", timeout=600)
    assert proc.ok, proc.log()[-3000:]
    assert "threads: 2" in proc.log()
    data = json.loads(out.read_text())
    assert data["threads"] == 2
    assert [r["model"] for r in data["results"]] == ["resnet18", "gpt2"]
    for r in data["results"]:
        assert r["wrapped_layers"] > 0
        assert r["export_inference"]["ratio"] > 0
        for k in ("K=0", "K=1"):
            train, mem = r["train"][k], r["memory"]["variants"][k]
            assert {"ratio", "ideal", "ratio_over_ideal", "target", "met"} <= set(train)
            assert {"over_plain", "over_formula", "formula_bytes", "met"} <= set(mem)
        assert r["train"]["K=0"]["ideal"] == pytest.approx(1.0)
        assert r["train"]["K=1"]["ideal"] > 1.0
