"""Transformers, attention and recurrent layers: what perforate wraps, and that it runs, grows
exactly and keeps its dendrites in every forward path."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import perfora
from perfora.nn.attention import RoutedMultiheadAttention


def _seeded(seed: int = 0) -> None:
    torch.manual_seed(seed)


def _encoder(layers: int = 2) -> nn.Module:
    _seeded()
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, layers, enable_nested_tensor=True),
                         nn.Linear(8, 2))


def _controller(model: nn.Module) -> perfora.GrowthController:
    ctl = perfora.GrowthController(model, seed=0, dendrite_init="default")
    ctl.set_optimizer(torch.optim.Adam, lr=1e-2)
    ctl.build_optimizer()
    return ctl


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
           target: torch.Tensor, steps: int = 3) -> None:
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x).reshape(-1, 2), target.reshape(-1)).backward()
        optimizer.step()


def _feed_all_dendrites(model: nn.Module, value: float = 0.5) -> None:
    with torch.no_grad():
        for layer in perfora.dendritic_layers(model).values():
            layer.out_weight.fill_(value)


def test_encoder_grows_its_feed_forward_layers_and_skips_the_attention_projection():
    model = _encoder()
    x = torch.randn(4, 5, 8)
    before = model(x).detach()
    report_lines: list[str] = []
    perfora.perforate(model)
    report = perfora.describe(model)
    report_lines = str(report).splitlines()
    wrapped = {w.path for w in report.wrapped}
    assert wrapped == {"0.layers.0.linear1", "0.layers.0.linear2", "0.layers.1.linear1",
                       "0.layers.1.linear2", "1"}
    assert any("self_attn.out_proj.weight" in line for line in report_lines)
    assert torch.equal(model(x), before)  # K=0 is the original model, bit for bit


def test_perforate_report_says_why_the_attention_projection_is_skipped(caplog):
    model = _encoder(1)
    with caplog.at_level("INFO", logger="perfora"):
        perfora.perforate(model)
    text = caplog.text
    assert "skipped 0.layers.0.self_attn.out_proj" in text
    assert "reads its weight directly" in text
    assert "paths=['0.layers.0.self_attn.out_proj']" in text


def test_encoder_trains_grows_exactly_and_eval_fast_path_keeps_the_dendrites():
    model = perfora.perforate(_encoder())
    ctl = _controller(model)
    x, target = torch.randn(4, 5, 8), torch.randint(0, 2, (4, 5))
    for _ in range(2):
        _train(model, ctl.optimizer, x, target)
        before = model(x).detach()
        ctl.add_dendrites()
        assert torch.equal(model(x), before)  # growth is exact
    _train(model, ctl.optimizer, x, target)
    ctl.step(1.0)  # ends the epoch perfora watches with hooks (hooks block the fast path)
    assert not any(m._forward_pre_hooks for m in model.modules())
    _feed_all_dendrites(model)
    model.eval()
    pad = torch.zeros(4, 5, dtype=torch.bool)
    pad[:, -1] = True
    slow = model[1](model[0](x, src_key_padding_mask=pad)).detach()  # grad on: no fast path
    with torch.no_grad():  # the fused inference paths would read linear1.weight directly
        fast = model[1](model[0](x, src_key_padding_mask=pad))
    assert torch.allclose(fast[~pad], slow[~pad], atol=1e-5)
    _feed_all_dendrites(model, 0.0)
    with torch.no_grad():
        without = model[1](model[0](x, src_key_padding_mask=pad))
    assert not torch.allclose(fast[~pad], without[~pad], atol=1e-3)  # dendrites did act


def test_decoder_layers_run_and_grow():
    _seeded()
    layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = nn.TransformerDecoder(layer, 2)
    perfora.perforate(model)
    assert sorted(perfora.dendritic_layers(model)) == [
        "layers.0.linear1", "layers.0.linear2", "layers.1.linear1", "layers.1.linear2"]
    tgt, memory = torch.randn(2, 4, 8), torch.randn(2, 6, 8)
    ctl = _controller(model)
    before = model(tgt, memory).detach()
    ctl.add_dendrites()
    assert torch.equal(model(tgt, memory), before)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kdim", [None, 6])
def test_explicit_attention_projection_is_routed_and_grows(batch_first, kdim):
    _seeded()
    attention = nn.MultiheadAttention(8, 2, batch_first=batch_first, kdim=kdim, vdim=kdim)
    model = nn.ModuleDict({"attn": attention})
    q = torch.randn(3, 5, 8) if batch_first else torch.randn(5, 3, 8)
    kv = torch.randn(3, 7, kdim or 8) if batch_first else torch.randn(7, 3, kdim or 8)
    reference = copy.deepcopy(attention)
    expected, expected_weights = reference(q, kv, kv)
    perfora.perforate(model, paths=["attn.out_proj"])
    assert isinstance(model["attn"], RoutedMultiheadAttention)
    out, weights = model["attn"](q, kv, kv)
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.allclose(weights, expected_weights, atol=1e-6)
    ctl = _controller(model)
    ctl.add_dendrites()
    assert torch.equal(model["attn"](q, kv, kv)[0], out)  # growth is exact
    _feed_all_dendrites(model)
    out = model["attn"](q, kv, kv)[0]
    assert not torch.allclose(out, expected, atol=1e-3)  # the dendrites feed the output
    out.sum().backward()
    layer = perfora.dendritic_layers(model)["attn.out_proj"]
    assert layer.bank_weight.grad is not None and layer.bank_weight.grad.abs().sum() > 0


def test_routed_attention_pickles_and_copies_with_its_dendrites():
    _seeded()
    model = nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True))
    perfora.perforate(model, paths=["0.self_attn.out_proj", "0.linear1"])
    _controller(model).add_dendrites()
    _feed_all_dendrites(model)
    x = torch.randn(2, 3, 8)
    expected = model(x)
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert torch.equal(clone(x), expected)


def test_attention_module_itself_is_refused_with_the_projection_to_use():
    model = nn.Sequential(nn.MultiheadAttention(8, 2))
    with pytest.raises(perfora.ConversionError, match=r"paths=\['0.out_proj'\]"):
        perfora.perforate(model, types=(nn.MultiheadAttention,), neuron_axes={"0": -1},
                          num_neurons={"0": 8})


class _GPTBlock(nn.Module):
    """A small decoder block written with scaled_dot_product_attention."""

    def __init__(self, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def test_gpt_style_block_grows_every_projection_exactly():
    _seeded()
    model = nn.Sequential(_GPTBlock(), _GPTBlock(), nn.Linear(16, 2))
    perfora.perforate(model)
    assert len(perfora.dendritic_layers(model)) == 9
    ctl = _controller(model)
    x, target = torch.randn(3, 6, 16), torch.randint(0, 2, (3, 6))
    losses = []
    for _ in range(2):
        _train(model, ctl.optimizer, x, target)
        before = model(x).detach()
        ctl.add_dendrites()
        assert torch.equal(model(x), before)
        losses.append(F.cross_entropy(model(x).reshape(-1, 2), target.reshape(-1)).item())
    _train(model, ctl.optimizer, x, target, steps=5)
    after = F.cross_entropy(model(x).reshape(-1, 2), target.reshape(-1)).item()
    assert after < losses[-1] and math.isfinite(after)
    assert all(layer.num_dendrites == 2 for layer in perfora.dendritic_layers(model).values())


def test_hugging_face_style_model_from_config_grows_exactly():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=16, num_labels=2)
    _seeded()
    model = transformers.BertForSequenceClassification(config).eval()
    ids = torch.randint(0, 40, (3, 7))
    before = model(input_ids=ids).logits.detach()
    perfora.perforate(model)
    layers = perfora.dendritic_layers(model)
    assert "bert.encoder.layer.0.attention.self.query" in layers
    assert "bert.encoder.layer.1.intermediate.dense" in layers
    assert torch.equal(model(input_ids=ids).logits, before)
    ctl = _controller(model)
    ctl.add_dendrites()
    assert torch.equal(model(input_ids=ids).logits, before)
    _feed_all_dendrites(model, 0.1)
    logits = model(input_ids=ids).logits
    assert not torch.allclose(logits, before, atol=1e-4)
    logits.sum().backward()
    assert layers["bert.encoder.layer.0.attention.self.query"].bank_weight.grad.abs().sum() > 0


@pytest.mark.parametrize("recurrent", [nn.LSTM, nn.GRU, nn.RNN, nn.LSTMCell, nn.GRUCell])
def test_recurrent_layers_are_refused_at_perforate_time(recurrent):
    model = nn.Sequential(recurrent(4, 3), nn.Linear(3, 2))
    with pytest.raises(perfora.ConversionError, match="recurrent layers"):
        perfora.perforate(model, types=(recurrent, nn.Linear), neuron_axes={"0": -1},
                          num_neurons={"0": 3})


@pytest.mark.parametrize("make", [lambda: nn.LSTM(4, 4), lambda: nn.GRUCell(4, 4),
                                  lambda: nn.Sequential(nn.LSTM(4, 4), nn.ReLU())])
def test_a_model_with_only_a_recurrent_layer_is_told_why_nothing_can_grow(make):
    with pytest.raises(perfora.PerforationError) as info:
        perfora.perforate(make())
    message = str(info.value)
    assert "recurrent layers take and return a hidden state" in message
    assert "Perforate the Linear layers that read its output" in message
    assert "no Linear or Conv layer" in message and "nothing to perforate" not in message


def test_a_selection_that_matches_nothing_still_lists_the_modules():
    with pytest.raises(perfora.PerforationError, match=r"nothing to perforate.*0 \(LSTM\)"):
        perfora.perforate(nn.Sequential(nn.LSTM(4, 4), nn.Linear(4, 2)), names=["Missing"])


class _Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, 6, batch_first=True)
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


def test_model_with_a_recurrent_layer_grows_its_linear_layers_by_default():
    _seeded()
    model = perfora.perforate(_Tagger())
    assert list(perfora.dendritic_layers(model)) == ["head"]
    x = torch.randn(2, 5, 4)
    before = model(x).detach()
    _controller(model).add_dendrites()
    assert torch.equal(model(x), before)


class _PairOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), x


def test_module_returning_a_tuple_fails_on_the_first_forward_not_after_growth():
    model = nn.Sequential(_PairOut())
    perfora.perforate(model, types=(_PairOut,), neuron_axes={"0": -1}, num_neurons={"0": 3})
    with pytest.raises(perfora.ConversionError, match="one tensor to one tensor"):
        model(torch.randn(2, 4))


class _ReadsWeight(nn.Module):
    """Reads its layers' weights the way fused kernels do (and one only for its dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.fused = nn.Linear(4, 4)
        self.typed = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.fused.weight, self.fused.bias)
        return self.typed(h.to(self.typed.weight.dtype))


def test_layers_whose_weight_is_read_directly_run_and_are_reported_when_idle():
    _seeded()
    model = perfora.perforate(_ReadsWeight())
    x = torch.randn(5, 4)
    assert model.typed.weight is model.typed.base.weight
    assert model.fused.bias is model.fused.base.bias
    ctl = _controller(model)
    F.mse_loss(model(x), torch.zeros(5, 2)).backward()
    ctl.optimizer.step()
    with pytest.warns(UserWarning, match=r"\['fused'\] never ran"):
        ctl.step(1.0)
