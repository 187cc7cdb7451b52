"""Mixture-of-Experts models whose router subclasses ``nn.Linear`` but returns scores with its
logits (Llama 4, PhiMoE): ``perforate`` leaves the router out with the reason (wrapped, the
model failed at its first forward), refuses it when named, and does not touch the random
state while it checks. Llama 4's shared expert (a Llama MLP whose activation is named
``activation_fn``) gains neurons exactly."""

from __future__ import annotations

import pytest
import torch

import perfora
from perfora.errors import PerforationError

T = pytest.importorskip("transformers", reason="transformers not installed")

IDS = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))
LAYERS = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
              vocab_size=64, num_key_value_heads=2)


def _build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "llama4":
        return T.Llama4TextModel(T.Llama4TextConfig(
            num_local_experts=2, num_experts_per_tok=1, intermediate_size_mlp=64, head_dim=16,
            **LAYERS))
    return T.PhimoeModel(T.PhimoeConfig(num_local_experts=4, num_experts_per_tok=2,
                                        input_jitter_noise=0.1, **LAYERS))


ROUTER = {"llama4": "layers.0.feed_forward.router", "phimoe": "layers.0.mlp.router"}


@pytest.mark.parametrize("name", ["llama4", "phimoe"])
def test_a_router_that_returns_a_tuple_is_left_out_and_the_model_grows(name, capsys):
    model = _build(name).train()  # PhiMoE's router draws random noise in training
    state = torch.random.get_rng_state()
    model = perfora.perforate(model, verbose=True)
    assert torch.equal(torch.random.get_rng_state(), state)  # the check drew nothing
    assert f"skipped {ROUTER[name]}: " in capsys.readouterr().out
    assert ROUTER[name] not in perfora.dendritic_layers(model)
    model.eval()
    with torch.no_grad():
        before = model(input_ids=IDS).last_hidden_state
    controller = perfora.GrowthController(model, growth="dendrites", write_files=False)
    controller.set_optimizer(torch.optim.Adam, lr=1e-3)
    controller.build_optimizer()
    controller.add_dendrites()
    with torch.no_grad():
        assert torch.equal(controller.model(input_ids=IDS).last_hidden_state, before)


def test_the_check_runs_no_hook_of_the_model():
    model = _build("llama4")
    calls = []
    router = model.get_submodule(ROUTER["llama4"])
    router.register_forward_hook(lambda *_: calls.append("router"))
    perfora.perforate(model)
    assert calls == []  # a user's hook sees only the model's own calls


@pytest.mark.parametrize("name", ["llama4", "phimoe"])
def test_the_router_named_in_paths_is_refused_with_the_reason(name):
    with pytest.raises(PerforationError, match="returns a tuple, not one tensor"):
        perfora.perforate(_build(name), paths=[ROUTER[name]])


def test_llama4s_shared_expert_gains_neurons_exactly():
    model = perfora.perforate(_build("llama4").eval())
    plan = perfora.plan_widening(model)
    hidden = "layers.0.feed_forward.shared_expert.gate_proj"
    assert hidden in plan.widenable and plan.layers[hidden].found_by == "Llama MLP"
    assert "residual" in plan.refused["layers.0.feed_forward.shared_expert.down_proj"]
    with torch.no_grad():
        before = model(input_ids=IDS).last_hidden_state
        for path in plan.widenable:
            perfora.widen(model, path, 4)
        assert torch.equal(model(input_ids=IDS).last_hidden_state, before)
