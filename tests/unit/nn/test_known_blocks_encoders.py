"""The feed-forward pairs of encoders people fine-tune that no model-wide trace reaches:
DistilBERT's ``lin1`` -> ``lin2``, ALBERT's ``ffn`` -> ``ffn_output`` (one layer run at every
depth), ConvNeXt's ``pwconv1`` -> ``pwconv2``, the wav2vec 2.0
family's ``intermediate_dense`` -> ``output_dense`` and SegFormer's Mix-FFN ``fc1`` -> depthwise
conv -> ``fc2``. Each grows exactly beside a trained dendrite set, its new neurons are wired to
the reader, it exports to a plain model with the same outputs (within the float rounding of an
exported dendrite set), and a rewind narrows it back; before, every one was refused ("torch.fx
cannot trace the model; pass pairs=")."""

from __future__ import annotations

import copy

import pytest
import torch

import perfora
from perfora.nn.perforation import layer_specs, rebuild_structure
from tests.support.widening import grow_a_trained_dendrite_set, known_pair

T = pytest.importorskip("transformers", reason="transformers not installed")


def _build(name: str) -> tuple[torch.nn.Module, str, dict]:
    """A tiny model, its first hidden layer that should gain neurons, and its forward inputs."""
    torch.manual_seed(0)
    images = {"pixel_values": torch.randn(2, 3, 32, 32)}
    if name == "distilbert":
        return (T.DistilBertModel(T.DistilBertConfig(
            vocab_size=64, dim=32, hidden_dim=64, n_layers=2, n_heads=2,
            max_position_embeddings=32)), "transformer.layer.0.ffn.lin1",
            {"input_ids": torch.randint(3, 64, (2, 6))})
    if name == "albert":  # one layer, run at both depths: the widening serves both
        return (T.AlbertModel(T.AlbertConfig(
            vocab_size=64, embedding_size=16, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64)),
            "encoder.albert_layer_groups.0.albert_layers.0.ffn",
            {"input_ids": torch.randint(3, 64, (2, 6))})
    if name == "convnext":
        return (T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1],
                                                 num_stages=2)),
                "encoder.stages.0.layers.0.pwconv1", images)
    if name == "wav2vec2":
        return (T.Wav2Vec2Model(T.Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)),
            "encoder.layers.0.feed_forward.intermediate_dense",
            {"input_values": torch.randn(2, 400)})
    if name == "pvt_v2":  # the Mix-FFN's pattern under other names, with a relu before
        return (T.PvtV2Model(T.PvtV2Config(
            image_size=32, hidden_sizes=[16, 32, 32, 32], depths=[1, 1, 1, 1],
            num_attention_heads=[1, 1, 1, 1], linear_attention=True)),
            "encoder.layers.0.blocks.0.mlp.dense1", images)
    return (T.SegformerModel(T.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        num_attention_heads=[1, 2], strides=[4, 2], patch_sizes=[7, 3], mlp_ratios=[2, 2])),
        "stages.0.blocks.0.mlp.fc1", images)


@pytest.mark.parametrize("name", ["distilbert", "albert", "convnext", "wav2vec2", "segformer",
                                  "pvt_v2"])
def test_the_feed_forward_pair_grows_neurons_exactly_and_exports(name):
    model, hidden, inputs = _build(name)
    model, reader = known_pair(model, hidden)
    grow_a_trained_dendrite_set(model, lambda: model(**inputs).last_hidden_state.square().mean())
    specs, state = copy.deepcopy(layer_specs(model)), copy.deepcopy(model.state_dict())
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
    width = model.get_submodule(hidden).source.out_features
    perfora.widen(model, hidden, 8)
    assert model.get_submodule(hidden).source.out_features == width + 8
    after = model(**inputs).last_hidden_state
    assert torch.equal(after, before)
    after.square().sum().backward()  # the new neurons reach the reader: its new columns learn
    new_columns = model.get_submodule(reader).source.weight.grad[:, width:]
    assert new_columns.abs().sum() > 0
    exported = perfora.export(model).eval()  # dendrites export as one GEMM: float rounding
    with torch.no_grad():
        assert torch.allclose(exported(**inputs).last_hidden_state, after, atol=1e-6)
    rebuild_structure(model, specs)  # the rewind to a best model from before the step
    model.load_state_dict(state)
    assert model.get_submodule(hidden).source.out_features == width
    with torch.no_grad():
        assert torch.equal(model(**inputs).last_hidden_state, before)


def test_a_convnext_v2_block_is_refused_for_its_response_norm():
    # GRN divides each channel by the mean over all channels: new neurons would change it
    torch.manual_seed(0)
    model = perfora.perforate(T.ConvNextV2Model(T.ConvNextV2Config(
        hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)).eval())
    plan = perfora.plan_widening(model)
    why = plan.refused["encoder.stages.0.layers.0.pwconv1"]
    assert why.startswith("the block also holds encoder.stages.0.layers.0.grn (ConvNextV2GRN)")
    with pytest.raises(perfora.PerforationError, match="grn"):
        perfora.widen(model, "encoder.stages.0.layers.0.pwconv1", 4)


def test_a_mix_ffn_whose_conv_is_not_depthwise_is_refused():
    model, hidden, _ = _build("segformer")
    block = model.get_submodule(hidden.rpartition(".")[0])
    block.dwconv.dwconv = torch.nn.Conv2d(32, 32, 3, padding=1)  # mixes channels
    plan = perfora.plan_widening(perfora.perforate(model))
    assert "is not a depthwise conv" in plan.refused[hidden]


def test_gradmax_pairs_rows_through_an_activation_but_not_through_a_depthwise_conv():
    # the one-to-one pairing of input and error rows leaves out the conv's neighbours
    from perfora.growth.widening_signal import pairs_rows

    for name, expected in (("distilbert", True), ("segformer", False)):
        model, hidden, _ = _build(name)
        model = perfora.perforate(model)
        entry = perfora.plan_widening(model).layers[hidden]
        assert pairs_rows(model, entry) is expected, name


def test_patch_embeddings_and_bert_attention_outputs_are_refused_as_the_residual_stream():
    # they were refused as "torch.fx cannot trace the model; pass pairs=", which cannot help
    torch.manual_seed(0)
    vit = T.ViTModel(T.ViTConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                 intermediate_size=64, image_size=32, patch_size=8))
    convnext, _, _ = _build("convnext")
    for model, path in ((vit, "embeddings.patch_embeddings.projection"),
                        (convnext, "embeddings.patch_embeddings")):
        why = perfora.plan_widening(model).refused[path]
        assert why.startswith("its output is the patch embedding") and "pairs=" not in why
    bert = perfora.perforate(T.BertModel(T.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64)))
    attention_out = "encoder.layer.0.attention.output.dense"
    assert "residual stream" in perfora.plan_widening(bert).refused[attention_out]
    with pytest.raises(perfora.PerforationError, match="pairs= names its readers, but"):
        perfora.widen(bert, attention_out, 4, pairs={attention_out: [
            "encoder.layer.0.intermediate.dense"]})
