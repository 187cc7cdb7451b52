"""``perfora.export`` keeps a tied lm_head tied (named in ``paths=`` and wrapped, with or
without dendrites): the exported head's weight is the embedding's Parameter, as in the live
model, and the exported model saves and reloads with the tie."""

from __future__ import annotations

import pytest
import torch

import perfora

transformers = pytest.importorskip("transformers", reason="transformers not installed")


def _tied_llama(sets: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=True))
    model = perfora.perforate(model, types=(torch.nn.Linear,), paths=["lm_head"]).eval()
    g = torch.Generator().manual_seed(1)
    for _ in range(sets):
        model.lm_head.grow(g)
    return model


@pytest.mark.parametrize("sets", [0, 1])
def test_export_keeps_a_wrapped_tied_head_tied(sets):
    model = _tied_llama(sets)
    exported = perfora.export(model)
    assert exported.lm_head.weight is exported.model.embed_tokens.weight
    assert exported.model.embed_tokens.weight is not model.model.embed_tokens.weight
    count = sum(p.numel() for p in exported.parameters())
    assert count == sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, model(input_ids=ids).logits)


def test_an_exported_tied_head_without_dendrites_reloads_tied(tmp_path):
    model = _tied_llama(0)
    exported = perfora.export(model)
    assert type(exported.lm_head) is torch.nn.Linear
    # the tied-weight keys name the plain head again (perforate named lm_head.base.weight)
    assert exported._tied_weights_keys == {"lm_head.weight": "model.embed_tokens.weight"}
    assert model._tied_weights_keys == {"lm_head.base.weight": "model.embed_tokens.weight"}
    exported.save_pretrained(tmp_path)
    loaded = type(exported).from_pretrained(tmp_path).eval()
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, exported(input_ids=ids).logits)
