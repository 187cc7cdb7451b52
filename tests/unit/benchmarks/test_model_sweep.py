"""``benchmarks/model_sweep.py`` on the models built from torch.nn alone (torchvision and timm
need a torch they are built for): every stage runs, growth and widening leave the outputs
bit-identical, and an unknown model name is refused with the choices."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import ROOT

SCRIPT = ROOT / "benchmarks" / "model_sweep.py"


def test_the_torch_nn_models_pass_every_stage(tmp_path, script_server):
    out = tmp_path / "sweep.json"
    proc = script_server.run(SCRIPT, "--models", "mlp,cnn_bn,transformer_encoder", "--out",
                             str(out), cwd=tmp_path / "job", timeout=240)
    assert proc.ok, proc.log()
    rows = json.loads(out.read_text())["rows"]
    assert [r["model"] for r in rows] == ["mlp", "cnn_bn", "transformer_encoder"]
    for row in rows:
        assert row["stage"] == "done" and "error" not in row, row
        assert row["grow_output_change"] == 0 and row["widen_output_change"] == 0, row
        assert row["loss_finite"] and row["export_diff"] < 1e-5, row
    assert rows[1]["widenable"] == "2/3"  # both convs (through BatchNorm and Hardswish)
    assert "| cnn_bn | 2 Conv2d, 1 Linear |" in proc.log()


def test_an_unknown_model_is_refused_with_the_choices(tmp_path, script_server):
    proc = script_server.run(SCRIPT, "--models", "resnet9000", cwd=tmp_path, timeout=120)
    assert proc.codes[0] != 0
    assert "unknown model 'resnet9000'" in proc.log() and "timm:NAME" in proc.log()


def test_hugging_face_models_pass_every_stage_and_widen_their_feed_forwards(tmp_path,
                                                                             script_server):
    # before, wav2vec 2.0 failed at its first dendrite set (a weight-normed conv) and
    # DistilBERT and SegFormer had no layer to widen
    pytest.importorskip("transformers")
    out = tmp_path / "sweep.json"
    models = "hf:distilbert,hf:segformer,hf:wav2vec2"
    proc = script_server.run(SCRIPT, "--models", models, "--out", str(out),
                             cwd=tmp_path / "job", timeout=240)
    assert proc.ok, proc.log()
    rows = {r["model"]: r for r in json.loads(out.read_text())["rows"]}
    for row in rows.values():
        assert row["stage"] == "done" and "error" not in row, row
        assert row["grow_output_change"] == 0 and row["widen_output_change"] == 0, row
    assert [rows[m]["widenable"] for m in models.split(",")] == ["2/12", "2/15", "2/10"]


def test_an_unknown_hugging_face_model_is_refused_with_the_names(tmp_path, script_server):
    pytest.importorskip("transformers")
    proc = script_server.run(SCRIPT, "--models", "hf:gpt9", cwd=tmp_path, timeout=120)
    assert proc.codes[0] != 0
    assert "unknown model 'hf:gpt9'" in proc.log() and "hf:NAME (gpt2, " in proc.log()
