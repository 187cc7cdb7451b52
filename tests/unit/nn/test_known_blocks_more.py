"""The feed-forward pairs of more Hugging Face decoders and encoder-decoders: GPT-NeoX
(Pythia), Falcon, BLOOM, GPT-J, GPT-Neo, GPTBigCode (StarCoder), MPT and Nemotron MLPs, and
the layers of OPT and the BART family, whose ``fc1`` -> ``fc2`` sits in the layer itself. Each
grows exactly and exports to a plain model with the same outputs; they were refused ("torch.fx
cannot trace the model; pass pairs=")."""

from __future__ import annotations

import pytest
import torch

import perfora
from tests.support.widening import known_pair

T = pytest.importorskip("transformers", reason="transformers not installed")

IDS = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))


def _build(name: str) -> tuple[torch.nn.Module, str, dict]:
    """A tiny model, its first hidden layer that should gain neurons, extra forward inputs."""
    torch.manual_seed(0)
    if name == "gpt_neox":
        return (T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=32)),
            "gpt_neox.layers.0.mlp.dense_h_to_4h", {})
    if name == "falcon":
        return (T.FalconForCausalLM(T.FalconConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            ffn_hidden_size=64)), "transformer.h.0.mlp.dense_h_to_4h", {})
    if name == "bloom":
        return (T.BloomForCausalLM(T.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2,
                                                 n_head=2)),
                "transformer.h.0.mlp.dense_h_to_4h", {})
    if name == "gptj":
        return (T.GPTJForCausalLM(T.GPTJConfig(
            vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32, rotary_dim=8,
            n_inner=64, bos_token_id=0, eos_token_id=0)), "transformer.h.0.mlp.fc_in", {})
    if name == "gpt_neo":  # the GPT-2 MLP's names on nn.Linear layers
        return (T.GPTNeoForCausalLM(T.GPTNeoConfig(
            vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
            max_position_embeddings=32, attention_types=[[["global", "local"], 1]])),
            "transformer.h.0.mlp.c_fc", {})
    if name == "gpt_bigcode":  # StarCoder's
        return (T.GPTBigCodeForCausalLM(T.GPTBigCodeConfig(
            vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_inner=64, n_positions=32)),
            "transformer.h.0.mlp.c_fc", {})
    if name == "mpt":  # up_proj -> GELU -> down_proj, the residual added in the MLP
        return (T.MptForCausalLM(T.MptConfig(d_model=32, n_heads=2, n_layers=2, vocab_size=64,
                                             expansion_ratio=2)),
                "transformer.blocks.0.ffn.up_proj", {})
    if name == "nemotron":  # up_proj -> relu squared -> down_proj, no gate
        return (T.NemotronForCausalLM(T.NemotronConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2)), "model.layers.0.mlp.up_proj", {})
    if name == "opt":
        return (T.OPTForCausalLM(T.OPTConfig(
            vocab_size=64, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=32, word_embed_proj_dim=32,
            pad_token_id=1, bos_token_id=0, eos_token_id=0)), "model.decoder.layers.0.fc1", {})
    return (T.BartForConditionalGeneration(T.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=32)), "model.decoder.layers.0.fc1",
        {"decoder_input_ids": IDS[:, :3]})


@pytest.mark.parametrize("name", ["gpt_neox", "falcon", "bloom", "gptj", "gpt_neo",
                                  "gpt_bigcode", "mpt", "nemotron", "opt", "bart"])
def test_the_feed_forward_pair_grows_neurons_exactly_and_exports(name):
    model, hidden, extra = _build(name)
    model, reader = known_pair(model, hidden)
    with torch.no_grad():
        before = model(input_ids=IDS, **extra).logits
    width = model.get_submodule(hidden).source.out_features
    perfora.widen(model, hidden, 8)
    assert model.get_submodule(hidden).source.out_features == width + 8
    exported = perfora.export(model).eval()
    with torch.no_grad():
        after = model(input_ids=IDS, **extra).logits
        assert torch.equal(after, before)
        assert torch.equal(exported(input_ids=IDS, **extra).logits, after)


def test_a_bart_like_layer_holding_more_than_attention_and_norms_is_refused():
    model, _, _ = _build("opt")
    layer = model.model.decoder.layers[0]
    layer.adapter = torch.nn.Linear(32, 32)  # something the pattern does not know
    plan = perfora.plan_widening(perfora.perforate(model))
    assert plan.refused["model.decoder.layers.0.fc1"].startswith(
        "the block also holds model.decoder.layers.0.adapter (LinearDendriticLayer)")
    assert "model.decoder.layers.1.fc1" in plan.widenable


def _hf_resnet(embedding_size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(T.ResNetForImageClassification(T.ResNetConfig(
        num_channels=1, embedding_size=embedding_size, hidden_sizes=[8, 16], depths=[1, 1],
        layer_type="basic", num_labels=3)).eval())


def test_a_resnet_conv_that_writes_the_residual_stream_is_refused_even_with_pairs():
    # the plan said "pass pairs=" for the stem; pairs= were accepted and the widened model
    # failed at its next forward (the residual add: 8 channels against 12)
    model = _hf_resnet(embedding_size=8)
    stem = "resnet.embedder.embedder.convolution"
    stage = "resnet.encoder.stages.0.layers.0"
    plan = perfora.plan_widening(model)
    for path in (stem, f"{stage}.layer.1.convolution",
                 "resnet.encoder.stages.1.layers.0.shortcut.convolution"):
        assert "residual stream of the ResNet stages" in plan.refused[path], path
        assert "pass pairs=" not in plan.refused[path]
    pairs = {stem: ["resnet.embedder.embedder.normalization", f"{stage}.layer.0.convolution"]}
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        before = model(pixel_values=x).logits
    with pytest.raises(perfora.PerforationError, match="pairs= names its readers, but its "
                                                       "output is added into the residual"):
        perfora.widen(model, stem, 4, pairs=pairs)
    with torch.no_grad():
        assert torch.equal(model(pixel_values=x).logits, before)  # nothing changed
    assert plan.layers[f"{stage}.layer.0.convolution"].widenable


def test_a_resnet_stem_read_by_a_projection_shortcut_is_not_ruled_out():
    model = _hf_resnet(embedding_size=6)  # the first layer projects 6 -> 8 channels
    plan = perfora.plan_widening(model)
    assert "residual" not in plan.refused["resnet.embedder.embedder.convolution"]


def test_a_models_output_head_is_named_as_such_where_the_model_does_not_trace():
    # "its output leaves the nn.Sequential classifier, so its consumer is unknown; pass
    # pairs=": no reader can take the new neurons of the labels' layer
    plan = perfora.plan_widening(_hf_resnet(embedding_size=8))
    assert plan.refused["classifier.1"].startswith("its output is an output of the model")
    assert "pairs=" not in plan.refused["classifier.1"]


def test_an_mlp_whose_activation_holds_parameters_is_not_taken_for_the_plain_pattern():
    # Apertus's xIELU learns its own parameters: a widening cannot apply it block by block,
    # so the up_proj -> down_proj pattern must not claim the block (it did: widen then failed)
    model, hidden, _ = _build("nemotron")
    model = perfora.perforate(model.eval())
    model.get_submodule(hidden.rpartition(".")[0]).act_fn = torch.nn.PReLU()
    plan = perfora.plan_widening(model)
    assert hidden not in plan.widenable
    with pytest.raises(perfora.PerforationError):
        perfora.widen(model, hidden, 4)
