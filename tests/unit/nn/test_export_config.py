"""After neuron growth, ``perfora.export`` gives a Hugging Face model a config with the grown
feed-forward width, so ``save_pretrained`` then ``from_pretrained`` loads it; layers grown to
different widths, which no config can describe, make the export warn."""

from __future__ import annotations

import warnings

import pytest
import torch

import perfora

transformers = pytest.importorskip("transformers", reason="transformers not installed")


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))).eval()


def _gpt2() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=16, n_layer=2, n_head=2, n_positions=16, vocab_size=50))
    ids = torch.randint(0, 50, (2, 7))
    return perfora.perforate(model, names=["Conv1D"], neuron_axes={"Conv1D": -1},
                             example_input=ids).eval(), ids


def _roundtrip(exported: torch.nn.Module, folder, ids: torch.Tensor) -> None:
    exported.save_pretrained(folder)
    loaded = type(exported).from_pretrained(folder).eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, exported(input_ids=ids).logits)


def test_a_llama_grown_alike_exports_with_its_new_intermediate_size(tmp_path):
    model = _llama()
    for layer in range(2):  # up_proj gains neurons with gate_proj, its partner
        perfora.widen(model, f"model.layers.{layer}.mlp.gate_proj", 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        exported = perfora.export(model)
    assert exported.config.intermediate_size == 53
    assert model.config.intermediate_size == 48  # the live model's config is not changed
    _roundtrip(exported, tmp_path, torch.randint(0, 64, (2, 6)))


def test_a_gpt2_grown_alike_exports_with_n_inner_set(tmp_path):
    model, ids = _gpt2()
    assert model.config.n_inner is None  # four times n_embd
    for path in perfora.plan_widening(model).widenable:
        perfora.widen(model, path, 3)
    exported = perfora.export(model)
    assert exported.config.n_inner == 67
    _roundtrip(exported, tmp_path, ids)


def test_layers_grown_to_different_widths_make_the_export_warn():
    model = _llama()
    perfora.widen(model, "model.layers.0.mlp.gate_proj", 5)
    with pytest.warns(UserWarning, match=r"model.layers.0.mlp.gate_proj: 48 -> 53.*"
                                         r"config.intermediate_size.*save_pretrained"):
        exported = perfora.export(model)
    assert exported.config.intermediate_size == 48


def test_a_model_never_widened_exports_its_config_unchanged():
    model = _llama()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        exported = perfora.export(model)
    assert exported.config.to_dict() == model.config.to_dict()


class _Wrapper(torch.nn.Module):
    """A user's module holding a Hugging Face model, as a LightningModule's ``self.lm``."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids).logits


def _nested_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(_Wrapper(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)))).eval()


def test_a_llama_nested_in_a_wrapper_exports_with_its_new_intermediate_size(tmp_path):
    model = _nested_llama()
    for layer in range(2):
        perfora.widen(model, f"lm.model.layers.{layer}.mlp.gate_proj", 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        exported = perfora.export(model)
    assert exported.lm.config.intermediate_size == 53
    assert model.lm.config.intermediate_size == 48
    ids = torch.randint(0, 64, (2, 6))
    _roundtrip(exported.lm, tmp_path, ids)
    with torch.no_grad():
        assert torch.allclose(exported(ids), model(ids), atol=1e-5)


def test_a_nested_llama_grown_to_different_widths_warns_once():
    model = _nested_llama()
    perfora.widen(model, "lm.model.layers.0.mlp.gate_proj", 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exported = perfora.export(model)
    messages = [str(w.message) for w in caught if "perfora.export" in str(w.message)]
    assert len(messages) == 1  # the LlamaModel inside LlamaForCausalLM is not checked again
    assert "lm.model.layers.0.mlp.gate_proj: 48 -> 53" in messages[0]
    assert "config.intermediate_size" in messages[0] and "(the model at lm)" in messages[0]
    assert exported.lm.config.intermediate_size == 48


def test_a_nested_cnn_config_that_names_no_width_warns():
    model = perfora.perforate(_Wrapper(transformers.ResNetForImageClassification(
        transformers.ResNetConfig(num_channels=1, embedding_size=8, hidden_sizes=[8, 16],
                                  depths=[1, 1], layer_type="basic", num_labels=10))))
    path = perfora.plan_widening(model).widenable[0]
    perfora.widen(model, path, 4)
    with pytest.warns(UserWarning, match=r"cannot be written into ResNetConfig \(the model at "
                                         r"lm\): its config names no such width"):
        exported = perfora.export(model)
    assert exported.lm.config.hidden_sizes == [8, 16]
