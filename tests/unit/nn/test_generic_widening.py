"""GPT-2's Conv1D layers, wrapped as generic dendritic layers, gain neurons after they hold
dendrite sets: exactly (the same bits), with the bank widened with them, trainable, undone by
a rewind, exported and reloaded."""

from __future__ import annotations

import copy

import pytest
import torch

import perfora
from perfora.nn.narrowing import narrow_widenings
from perfora.nn.perforation import layer_specs, rebuild_structure

transformers = pytest.importorskip("transformers", reason="transformers not installed")

CONV1D = {"names": ["Conv1D"], "neuron_axes": {"Conv1D": -1}}


def _gpt2(sets: int = 2) -> tuple[torch.nn.Module, torch.Tensor]:
    """A tiny perforated GPT-2 (no dropout) whose Conv1D layers hold ``sets`` dendrite sets
    with nonzero ``v`` (so the bank takes part in the output)."""
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(
        n_embd=16, n_layer=2, n_head=2, n_positions=16, vocab_size=50, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    ids = torch.randint(0, 50, (2, 7))
    model = perfora.perforate(model, **CONV1D, example_input=ids).eval()
    g = torch.Generator().manual_seed(1)
    for layer in perfora.dendritic_layers(model).values():
        assert layer.kind == "generic"
        for _ in range(sets):
            layer.grow(g)
        if sets:
            with torch.no_grad():
                layer.out_weight.normal_(0, 0.1)
    return model, ids


def test_plan_lists_the_mlp_of_a_gpt2_holding_dendrites():
    model, _ = _gpt2()
    plan = perfora.plan_widening(model)
    assert plan.widenable == ["h.0.mlp.c_fc", "h.1.mlp.c_fc"]
    assert plan.layers["h.0.mlp.c_fc"].consumers == [("h.0.mlp.c_proj", 1)]


@pytest.mark.parametrize("train", [False, True])
def test_a_gpt2_conv1d_with_dendrites_widens_exactly_with_its_bank(train):
    model, ids = _gpt2()
    model.train(train)
    want = model(ids).last_hidden_state
    perfora.widen(model, "h.0.mlp.c_fc", 3)
    perfora.widen(model, "h.0.mlp.c_fc", 2)
    assert torch.equal(model(ids).last_hidden_state, want)
    c_fc, c_proj = model.h[0].mlp.c_fc, model.h[0].mlp.c_proj
    assert c_fc.source.weight.shape == (16, 69) and c_fc.num_neurons == 69
    assert c_fc.bank_params["weight"].shape == (2, 16, 69)
    assert c_fc.bank_params["bias"].shape == (2, 69)
    assert c_fc.out_weight.shape == (2, 69)
    assert c_proj.source.weight.shape == (69, 16)
    assert c_proj.bank_params["weight"].shape == (2, 69, 16)
    # the new neurons' bank rows are drawn, their zero v and outgoing columns keep the output
    assert c_fc.bank_params["weight"][:, :, 64:].abs().sum() > 0
    assert torch.equal(c_proj.bank_params["weight"][:, 64:], torch.zeros(2, 5, 16))
    # and the new columns learn
    model.train()
    model(ids).last_hidden_state.square().mean().backward()
    assert c_proj.source.weight.grad[64:].abs().sum() > 0
    assert c_fc.out_weight.grad is not None


def test_a_widened_gpt2_with_dendrites_narrows_back_to_the_snapshot():
    model, ids = _gpt2()
    specs, state = copy.deepcopy(layer_specs(model)), copy.deepcopy(model.state_dict())
    want = model(ids).last_hidden_state
    perfora.widen(model, "h.1.mlp.c_fc", 4)
    narrow_widenings(model, "h.1.mlp.c_fc", 0)
    assert model.h[1].mlp.c_fc.bank_params["weight"].shape == (2, 16, 64)
    assert model.h[1].mlp.c_proj.bank_params["weight"].shape == (2, 64, 16)
    rebuild_structure(model, specs)
    model.load_state_dict(state)
    assert torch.equal(model(ids).last_hidden_state, want)


def test_a_widened_gpt2_with_dendrites_exports_and_reloads(tmp_path):
    model, ids = _gpt2(sets=1)
    perfora.widen(model, "h.0.mlp.c_fc", 3)
    want = model(ids).last_hidden_state
    exported = perfora.export(model)
    torch.testing.assert_close(exported(ids).last_hidden_state, want)
    perfora.save_model(model, tmp_path / "m.safetensors")
    fresh, _ = _gpt2(sets=0)
    perfora.load_model(fresh, tmp_path / "m.safetensors")
    assert torch.equal(fresh.eval()(ids).last_hidden_state, want)


def test_the_neuron_step_grows_a_gpt2_holding_dendrites():
    model, _ = _gpt2(sets=1)
    ctl = perfora.GrowthController(model, write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    ctl.build_optimizer()
    decision = ctl.add_neurons()
    assert "h.0.mlp.c_fc: +" in decision.reason and "h.1.mlp.c_fc: +" in decision.reason
    assert model.h[0].mlp.c_fc.num_neurons > 64
