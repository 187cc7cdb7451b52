"""growth='neurons' through the controller on the models people fine-tune (GPT-2, BERT,
Llama built from configs) and on a CNN with BatchNorm: each growth step widens the layers
whose readers are known, keeps the output bit for bit, and the widened model trains on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora
from tests.support.zoo import hf_models

MODELS = {m.name: m for m in hf_models()}
WIDENED = {"gpt2": "transformer.h.0.mlp.c_fc",
           "bert-cls": "bert.encoder.layer.0.intermediate.dense",
           "llama-untied": "model.layers.0.mlp.gate_proj"}


def _grow_once(model: nn.Module, loss_fn, batch, out_fn) -> tuple[perfora.GrowthController,
                                                                   nn.Module]:
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, neurons_per_step=0.25,
                                   neuron_init="gradmax", write_files=False)
    ctl.set_optimizer(torch.optim.AdamW, lr=1e-3)
    opt, _ = ctl.build_optimizer()
    model.train()
    opt.zero_grad()
    loss_fn(model, batch).backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        before = out_fn(model, batch)
    decision = ctl.step(0.5)
    assert decision.restructured, decision.reason
    with torch.no_grad():
        assert torch.equal(out_fn(decision.model, batch), before)
    decision.model.train()
    losses = []
    for _ in range(2):
        decision.optimizer.zero_grad()
        loss = loss_fn(decision.model, batch)
        loss.backward()
        decision.optimizer.step()
        losses.append(float(loss.detach()))
    assert all(torch.isfinite(torch.tensor(losses)))
    return ctl, decision.model


@pytest.mark.parametrize("name", sorted(WIDENED))
def test_a_transformer_grows_its_feed_forward_neurons_exactly(name):
    zoo = MODELS[name]
    model = perfora.perforate(zoo.build(), **zoo.perforate_kwargs)
    batch = zoo.inputs()
    layer = perfora.dendritic_layers(model)[WIDENED[name]]
    width = layer.num_neurons
    ctl, grown = _grow_once(model, zoo.loss, batch,
                            lambda m, b: zoo.output(m(**b)))
    assert perfora.dendritic_layers(grown)[WIDENED[name]].num_neurons == width + width // 4
    # GradMax reads Linear -> Linear pairs; Llama's gated pair (gate * up) grows at random
    init = "random" if name.startswith("llama") else "gradmax"
    assert f"{WIDENED[name]}: +{width // 4} {init}" in ctl.state.history[-1]["reason"]
    # attention projections and the residual stream never widen
    for path, other in perfora.dendritic_layers(grown).items():
        if "attn" in path or "attention" in path:
            assert not getattr(other, "widenings", None), path


def test_a_cnn_with_batchnorm_grows_channels_exactly():
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(4 * 3 * 3, 8), nn.ReLU(), nn.Linear(8, 3)))
    x = torch.randn(6, 3, 8, 8)
    y = torch.randint(0, 3, (6,))
    _, grown = _grow_once(model, lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
                          (x, y), lambda m, b: m(b[0]))
    assert grown[0].num_neurons == 5 and grown[1].num_features == 5
    assert grown[5].base.in_features == 5 * 9 and grown[5].num_neurons == 10


def test_a_widened_gpt2_saves_and_loads_into_a_fresh_model(tmp_path):
    zoo = MODELS["gpt2"]
    model = perfora.perforate(zoo.build(), **zoo.perforate_kwargs)
    batch = zoo.inputs()
    _, grown = _grow_once(model, zoo.loss, batch, lambda m, b: zoo.output(m(**b)))
    grown.eval()
    perfora.save_model(tmp_path / "gpt2.safetensors", grown)
    loaded = perfora.load_model(zoo.build(), tmp_path / "gpt2.safetensors").eval()
    with torch.no_grad():
        assert torch.equal(zoo.output(loaded(**batch)), zoo.output(grown(**batch)))
