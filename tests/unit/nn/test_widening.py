"""Growing neurons is exact: after ``perfora.widen`` a model computes the same bits, in eval
and in train mode, on MLPs, CNNs with BatchNorm, Transformer blocks (torch, GPT-2, BERT,
Llama) and with dendrites; the new outgoing columns then learn."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import perfora


def _same_after(model: nn.Module, x, widenings, *, train: bool) -> nn.Module:
    """Widen a copy of ``model`` and check its output against the original, bit for bit."""
    torch.manual_seed(3)
    before = copy.deepcopy(model).train(train)
    after = copy.deepcopy(model).train(train)
    for path, k in widenings:
        perfora.widen(after, path, k)
    torch.manual_seed(7)  # the same dropout masks for both
    want = before(x)
    torch.manual_seed(7)
    got = after(x)
    assert torch.equal(got, want)
    if train:  # BatchNorm's running statistics of the old channels moved alike
        for (name, a), (_, b) in zip(before.state_dict().items(), after.state_dict().items(),
                                     strict=True):
            if "running" in name:
                assert torch.equal(b[:a.shape[0]], a), name
    return after


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 16), nn.SiLU(), nn.Dropout(0.2), nn.Linear(16, 9),
                         nn.Sigmoid(), nn.Linear(9, 3))


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(8, 6, 3), nn.BatchNorm2d(6), nn.GELU(),
                         nn.AvgPool2d(2), nn.Flatten(), nn.Linear(24, 5))


@pytest.mark.parametrize("train", [False, True])
def test_an_mlp_widened_twice_computes_the_same_bits(train):
    torch.manual_seed(0)
    after = _same_after(_mlp(), torch.randn(33, 5), [("0", 4), ("3", 3), ("0", 2)],
                        train=train)
    assert after[0].weight.shape == (22, 5) and after[3].weight.shape == (12, 22)
    assert after[5].weight.shape == (3, 12)


@pytest.mark.parametrize("train", [False, True])
def test_a_cnn_with_batchnorm_pool_and_flatten_computes_the_same_bits(train):
    torch.manual_seed(0)
    after = _same_after(_cnn(), torch.randn(4, 3, 12, 12), [("0", 3), ("4", 2)], train=train)
    bn = after[5]
    assert bn.num_features == 8 and torch.equal(bn.running_var[6:], torch.ones(2)) or train
    # the Linear after Flatten gained 2 channels x 2 x 2 positions, at the end
    assert after[9].weight.shape == (5, 32)
    assert torch.equal(after[9].weight[:, 24:], torch.zeros(5, 8))


@pytest.mark.parametrize("mode", [False, True])
def test_the_wrappers_a_widening_adds_take_the_mode_of_what_they_wrap(mode):
    model = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Dropout(0.5), nn.Linear(12, 2))
    model.train(mode)
    perfora.widen(model, "0", 4)
    assert type(model[1]).__name__ == "Blockwise"
    assert {m.training for m in model.modules()} == {mode}


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("train", [False, True])
def test_a_transformer_encoder_layer_widens_its_feed_forward_only(activation, train):
    torch.manual_seed(0)
    # in train mode a dropout after the widened block would draw its masks from a shifted
    # random stream (the new units drew some first): no dropout there
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0 if train else 0.1,
                                       activation=activation, batch_first=True)
    after = _same_after(layer, torch.randn(3, 5, 16), [("linear1", 5)], train=train)
    assert after.linear1.out_features == 37 and after.linear2.in_features == 37
    assert after.linear2.out_features == 16  # d_model never grows
    with torch.no_grad():  # the inference fast path is off, so the blocks are kept
        assert torch.equal(after.eval()(torch.ones(2, 3, 16)),
                           layer.eval()(torch.ones(2, 3, 16)))


def test_an_encoder_passing_nested_tensors_on_runs_a_widened_later_layer_exactly():
    # with a padding mask in inference, nn.TransformerEncoder hands its layers nested tensors
    # (its first layer decides); a widened second layer failed on them ("doesn't support sizes")
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, 0.0, batch_first=True),
                                    2).eval()
    x = torch.randn(3, 5, 16)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    with torch.no_grad():
        before = encoder(x, src_key_padding_mask=mask)
        perfora.widen(encoder, "layers.1.linear1", 8)
        assert torch.equal(encoder(x, src_key_padding_mask=mask), before)


def test_a_transformer_decoder_layer_widens_its_feed_forward():
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(8, 2, 12, dropout=0.0, batch_first=True)
    tgt, memory = torch.randn(2, 4, 8), torch.randn(2, 6, 8)
    before = layer(tgt, memory)
    perfora.widen(layer, "linear1", 3)
    assert torch.equal(layer(tgt, memory), before)


def _hf(name: str):
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    if name == "gpt2":  # no dropout: in train mode its masks would shift (see above)
        return transformers.GPT2Model(transformers.GPT2Config(
            n_embd=16, n_layer=2, n_head=2, n_positions=16, vocab_size=50, bos_token_id=0,
            eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    return transformers.BertModel(transformers.BertConfig(
        hidden_size=16, intermediate_size=24, max_position_embeddings=16, vocab_size=50,
        num_hidden_layers=2, num_attention_heads=2, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))


@pytest.mark.parametrize("name, hidden", [("gpt2", "mlp.c_fc"),
                                          ("bert", "intermediate.dense")])
@pytest.mark.parametrize("train", [False, True])
def test_hugging_face_gpt2_and_bert_blocks_widen_exactly(name, hidden, train):
    torch.manual_seed(0)
    model = _hf(name).train(train)
    ids = torch.randint(0, 50, (2, 7))
    plan = perfora.plan_widening(model, trace=False)
    widenable = plan.widenable
    assert widenable == [p for p in plan.layers if p.endswith(hidden)] and len(widenable) == 2
    torch.manual_seed(1)
    want = model(ids).last_hidden_state
    for path in widenable:
        perfora.widen(model, path, 3)
    torch.manual_seed(1)
    assert torch.equal(model(ids).last_hidden_state, want)
    if name == "gpt2":  # Conv1D keeps its [in, out] layout
        mlp = model.h[0].mlp
        assert mlp.c_fc.weight.shape == (16, 67) and mlp.c_proj.weight.shape == (67, 16)


def test_llama_gate_and_up_projections_widen_together():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    from transformers.models.llama.modeling_llama import LlamaMLP
    torch.manual_seed(0)
    mlp = LlamaMLP(transformers.LlamaConfig(hidden_size=16, intermediate_size=24,
                                            num_attention_heads=2, num_key_value_heads=2,
                                            hidden_act="silu"))
    x = torch.randn(2, 5, 16)
    want = mlp(x)
    entry = perfora.widen(mlp, "gate_proj", 4)
    assert entry.partners == ["up_proj"]
    assert mlp.gate_proj.out_features == mlp.up_proj.out_features == 28
    assert mlp.down_proj.in_features == 28
    assert torch.equal(mlp(x), want)
    assert not perfora.plan_widening(mlp).layers["down_proj"].widenable


def _dendritic_mlp(selective: bool) -> nn.Module:
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6),
                                            nn.Sigmoid(), nn.Linear(6, 3)))
    g = torch.Generator().manual_seed(0)
    for layer in perfora.dendritic_layers(model).values():
        layer.grow(g, neurons=[0, 2] if selective else None)
        layer.grow(g)
        with torch.no_grad():  # trained-looking dendrites, so they matter to the output
            layer.out_weight.normal_()
            layer.cascade.normal_()
    return model


@pytest.mark.parametrize("selective", [False, True])
def test_dendrites_and_neurons_combine_exactly_at_each_step(selective):
    model = _dendritic_mlp(selective)
    x = torch.randn(7, 5)
    want = model(x)
    perfora.widen(model, "0", 3)
    assert torch.equal(model(x), want)
    # the consumer's base and bank read the new inputs with zero columns
    assert torch.equal(model[2].base.weight[:, 8:], torch.zeros(6, 3))
    assert not model[2].bank_weight[:, 8:].any()
    perfora.widen(model, "2", 2)
    assert torch.equal(model(x), want)
    g = torch.Generator().manual_seed(1)
    for layer in perfora.dendritic_layers(model).values():
        layer.grow(g)
        assert torch.equal(model(x), want)
    first = model[0]
    assert first.num_neurons == 11 and first.out_weight.shape == (3, 11)
    assert torch.equal(first.out_weight[:2, 8:], torch.zeros(2, 3))
    if selective:  # the new neurons are fed by none of the old sets
        assert not first.dendrite_mask[:2, 8:].any()
    else:  # full sets gained bank rows for them (random, so they can learn)
        assert first.bank_weight.shape == (3 * 11, 5)


def test_backprop_after_widening_reaches_the_new_outgoing_weights():
    model = _dendritic_mlp(False)
    perfora.widen(model, "0", 3)
    x = torch.randn(16, 5)
    model(x).square().sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert model[2].base.weight.grad[:, 8:].abs().sum() > 0


def test_a_conv_consumer_gains_zero_input_channels():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(2, 4, 3), nn.Tanh(), nn.Conv1d(4, 3, 1), nn.Flatten(),
                        nn.Linear(3 * 5, 2))
    _same_after(net, torch.randn(3, 2, 7), [("0", 2), ("2", 1)], train=True)


def test_an_unbatched_input_still_works_after_widening():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Conv2d(3, 2, 1))
    x = torch.randn(2, 6, 6)
    want = net(x)
    perfora.widen(net, "0", 2)
    assert torch.equal(net(x), want)


@pytest.mark.parametrize("train", [False, True])
def test_a_conv_grouped_with_its_batchnorm_and_a_dendritic_conv_consumer_widen_exactly(train):
    torch.manual_seed(0)
    net = perfora.perforate(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                                          nn.ReLU(), nn.Conv2d(4, 5, 3), nn.ReLU(),
                                          nn.Conv2d(5, 2, 1)), group_norms=True)
    g = torch.Generator().manual_seed(0)
    for layer in perfora.dendritic_layers(net).values():
        layer.grow(g)
        layer.grow(g)
        with torch.no_grad():
            layer.out_weight.normal_()
            layer.cascade.normal_()
    after = _same_after(net, torch.randn(2, 3, 8, 8), [("0", 2), ("3", 3)], train=train)
    assert after[0].base[1].num_features == 6  # the grouped BatchNorm gained the channels
    bank = after[3].bank_weight  # per set: 5 old rows (zero new columns), then 3 new rows
    assert bank.shape[:2] == (16, 6)
    assert not bank[:5, 4:].any() and not bank[8:13, 4:].any()


def test_describe_names_the_users_class_and_the_width_a_widened_layer_started_with():
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    perfora.widen(model, "0", 4)
    perfora.widen(model, "0", 4)
    report = perfora.describe(model)
    assert [(w.path, w.type, w.neurons, w.started_with) for w in report.wrapped] == [
        ("0", "Linear", 16, 8), ("2", "Linear", 2, None)]  # not perfora's BlockedLinear
    assert "0  Linear  neurons=16 (started with 8) axis=-1" in str(report)


def _t5(gated: bool):
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=50, d_model=16, d_kv=4, d_ff=24, num_layers=1, num_heads=2,
        decoder_start_token_id=0, dropout_rate=0.0,
        feed_forward_proj="gated-gelu" if gated else "relu"))


@pytest.mark.parametrize("gated", [False, True])
def test_t5_feed_forward_widens_exactly(gated):
    # T5's wi -> act -> wo (T5 v1.1 and mT5: act(wi_0) * wi_1 -> wo, wi_0 and wi_1 together)
    torch.manual_seed(0)
    model = perfora.perforate(_t5(gated)).eval()
    ids, dec = torch.randint(0, 50, (2, 5)), torch.randint(0, 50, (2, 4))
    want = model(input_ids=ids, decoder_input_ids=dec).logits
    plan = perfora.plan_widening(model)
    first = "wi_0" if gated else "wi"
    chosen = [p for p in plan.widenable if p.endswith(first)]
    assert len(chosen) == 2 and all(plan.layers[p].found_by == "T5 feed-forward"
                                    for p in chosen)  # the encoder's and the decoder's
    assert not plan.layers[chosen[0].rsplit(".", 1)[0] + ".wo"].widenable  # residual stream
    for path in chosen:
        perfora.widen(model, path, 4)
    ff = model.encoder.block[0].layer[1].DenseReluDense
    assert ff.wo.source.in_features == 28
    assert torch.equal(model(input_ids=ids, decoder_input_ids=dec).logits, want)


def test_vit_mlp_widens_exactly():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    torch.manual_seed(0)
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=24, num_labels=3))
    model = perfora.perforate(vit).eval()
    x = torch.randn(2, 3, 8, 8)
    want = model(x).logits
    plan = perfora.plan_widening(model)
    if not any(p.endswith("mlp.fc1") for p in plan.layers):  # transformers < 5: BERT names
        assert sum(p.endswith("intermediate.dense") for p in plan.widenable) == 2
    else:
        assert [p for p in plan.widenable] == [f"vit.layers.{i}.mlp.fc1" for i in range(2)]
    for path in plan.widenable:
        perfora.widen(model, path, 4)
    assert torch.equal(model(x).logits, want)
