"""The model zoo (tests/support/zoo.py): real architectures at a tiny size through
perforate, growth, training, export, torch.export, ONNX and the save/load round
trips. What perforate wraps in each is listed in docs/zoo.md."""

from __future__ import annotations

import collections

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

import perfora  # noqa: E402
from tests.support.zoo import (  # noqa: E402
    ZooModel,
    all_models,
    feed,
    timm_error,
    timm_models,
    torchvision_error,
    torchvision_models,
)

ZOO = all_models()
IDS = [z.name for z in ZOO]
EXPORTABLE = ZOO  # T5 and ViT read layer.weight.dtype, MobileNetV2 conv.stride: answered


def _perforated(zoo: ZooModel) -> torch.nn.Module:
    return perfora.perforate(zoo.build(), **zoo.perforate_kwargs)


def _grown(zoo: ZooModel, sets: int = 2, feed_value: float | None = 0.1) -> torch.nn.Module:
    """Perforated, every layer grown ``sets`` times (seeded), dendrites fed by
    ``feed_value`` so that they change the output (None: left at zero, output unchanged)."""
    model = _perforated(zoo)
    gen = torch.Generator().manual_seed(3)
    for layer in perfora.dendritic_layers(model).values():
        for _ in range(sets):
            layer.grow(gen)
        if feed_value is not None:
            with torch.no_grad():
                layer.out_weight.fill_(feed_value)
    return model.eval()


def _out(zoo: ZooModel, model: torch.nn.Module) -> torch.Tensor:
    fed, args = feed(zoo, model)
    with torch.no_grad():
        return fed(*args)


@pytest.mark.parametrize("zoo", ZOO, ids=IDS)
def test_default_perforate_wraps_the_expected_layers_and_says_what_it_skipped(zoo, caplog):
    with caplog.at_level("INFO", logger="perfora"):
        model = _perforated(zoo)
    kinds = collections.Counter(w.type for w in perfora.describe(model).wrapped)
    assert dict(kinds) == zoo.wrapped
    for path in zoo.skipped:
        assert f"skipped {path}: " in caplog.text
        assert path not in perfora.dendritic_layers(model)


@pytest.mark.parametrize("zoo", ZOO, ids=IDS)
def test_two_dendrite_sets_leave_the_output_bit_identical(zoo):
    before = _out(zoo, zoo.build())
    grown = _grown(zoo, feed_value=None)
    assert all(layer.num_dendrites == 2 for layer in perfora.dendritic_layers(grown).values())
    assert torch.equal(_out(zoo, grown), before)


# the layers neuron growth finds in each (docs/zoo.md): the Transformers' feed-forward hidden
# layers, the ResNet's first convolution of each basic block (through its ConvLayer modules);
# MobileNetV2's expanding convolution of each inverted residual block (and the stem's first),
# through the depthwise conv that gains channels with it; EfficientNet's, through its
# squeeze-excitation gate too
WIDENABLE = {"gpt2": 2, "llama-tied": 4, "llama-untied": 4, "bert-cls": 2, "bert-mlm": 2,
             "t5": 2, "hf-vit": 2, "hf-resnet": 2, "hf-mobilenet-v2": 17, "hf-efficientnet": 13}


@pytest.mark.parametrize("zoo", ZOO, ids=IDS)
def test_every_layer_the_plan_widens_gains_neurons_with_the_output_bit_identical(zoo):
    model = _perforated(zoo).eval()
    before = _out(zoo, model)
    widenable = perfora.plan_widening(model).widenable
    assert len(widenable) == WIDENABLE.get(zoo.name, len(widenable))
    for path in widenable:
        perfora.widen(model, path, 2)
    assert torch.equal(_out(zoo, model), before)


@pytest.mark.parametrize("zoo", ZOO, ids=IDS)
def test_grown_model_trains_with_a_finite_falling_loss(zoo):
    torch.manual_seed(0)
    model = _grown(zoo).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch, losses = zoo.inputs(), []
    for _ in range(3):
        opt.zero_grad()
        loss = zoo.loss(model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[2] < losses[0], losses


@pytest.mark.parametrize("zoo", EXPORTABLE, ids=[z.name for z in EXPORTABLE])
def test_export_and_torch_export_equal_the_live_model(zoo):
    model = _grown(zoo)
    expected = _out(zoo, model)
    exported = perfora.export(model).eval()
    assert not perfora.dendritic_layers(exported)
    assert torch.allclose(_out(zoo, exported), expected, atol=1e-5, rtol=1e-5)
    fed, args = feed(zoo, exported)
    program = torch.export.export(fed, args)
    assert torch.allclose(program.module()(*args), expected, atol=1e-5, rtol=1e-5)


ONNX = [z for z in ZOO if z.name == "bert-cls" and z.onnx]  # ~10 s an export: one model


@pytest.mark.slow
@pytest.mark.parametrize("zoo", ONNX, ids=[z.name for z in ONNX])
def test_onnx_export_agrees_with_onnxruntime(zoo):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = _grown(zoo)
    expected = _out(zoo, model)
    fed, args = feed(zoo, perfora.export(model).eval())
    program = torch.onnx.export(fed, args, dynamo=True, optimize=False, verbose=False)
    session = ort.InferenceSession(program.model_proto.SerializeToString())
    got = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)})
    assert torch.allclose(torch.from_numpy(got[0]), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("zoo", ZOO, ids=IDS)
def test_save_model_and_save_dendrites_round_trip_onto_a_fresh_model(zoo, tmp_path):
    model = _grown(zoo)
    expected = _out(zoo, model)
    perfora.save_model(tmp_path / "model.pt", model)
    perfora.save_dendrites(model, tmp_path / "dendrites.pt")
    loaded = perfora.load_model(zoo.build(), tmp_path / "model.pt").eval()
    assert torch.equal(_out(zoo, loaded), expected)
    # the same base weights (same seed) plus the saved dendrites: the grown model again
    fresh = zoo.build()
    perfora.load_dendrites(fresh, tmp_path / "dendrites.pt")
    assert torch.equal(_out(zoo, fresh.eval()), expected)


def test_torchvision_models_are_listed_or_the_reason_is_given():
    why = torchvision_error()
    if why is not None:
        pytest.skip(f"torchvision unavailable: {why}")
    assert {z.name for z in torchvision_models()} <= set(IDS)


def test_timm_models_are_listed_or_the_reason_is_given():
    why = timm_error()
    if why is not None:
        pytest.skip(f"timm unavailable: {why}")
    assert {z.name for z in timm_models()} <= set(IDS)
