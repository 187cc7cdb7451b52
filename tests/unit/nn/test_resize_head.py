"""``resize_token_embeddings`` on a Hugging Face model whose ``lm_head`` is a dendritic layer:
the wrapped Linear is resized by transformers and its dendrite sets follow (untied: it raised
TypeError; tied: the bank kept the old vocabulary and the next forward failed)."""

from __future__ import annotations

import copy

import pytest
import torch

import perfora

transformers = pytest.importorskip("transformers", reason="transformers not installed")


def _llama(tied: bool, sets: int = 1) -> torch.nn.Module:
    """A tiny Llama with its lm_head wrapped and holding ``sets`` dendrite sets (nonzero v)."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=tied))
    model = perfora.perforate(model, types=(torch.nn.Linear,),
                              **({"paths": ["lm_head"]} if tied else {})).eval()
    g = torch.Generator().manual_seed(1)
    for _ in range(sets):
        model.lm_head.grow(g)
    with torch.no_grad():
        if sets:
            model.lm_head.out_weight.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_a_wrapped_lm_head_with_dendrites_resizes_with_its_bank(tied):
    model = _llama(tied)
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    model.resize_token_embeddings(80, mean_resizing=False)
    head = model.lm_head
    assert isinstance(head, perfora.DendriticLayer)
    assert head.weight.shape == (80, 32) and head.num_neurons == 80
    assert head.bank_weight.shape == (80, 32) and head.out_weight.shape == (1, 80)
    assert torch.equal(head.out_weight[:, 64:], torch.zeros(1, 16))
    assert (head.weight is model.model.embed_tokens.weight) == tied
    with torch.no_grad():
        got = model(input_ids=torch.cat([ids, torch.tensor([[70], [79]])], 1)).logits
    assert got.shape[-1] == 80
    torch.testing.assert_close(got[:, :6, :64], want)
    model.train()  # and it trains
    model(input_ids=ids, labels=ids).loss.backward()
    assert head.bank_weight.grad is not None and head.weight.grad is not None


def test_a_wrapped_lm_head_shrinks_and_a_tied_one_still_saves(tmp_path):
    model = _llama(tied=True, sets=2)
    model.resize_token_embeddings(60)
    assert model.lm_head.bank_weight.shape == (120, 32)  # 2 sets of 60 rows
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model(input_ids=torch.randint(0, 60, (2, 5))).logits.shape == (2, 5, 60)
    model.save_pretrained(tmp_path)  # the shared tensor is still declared under its wrapped key


def test_a_copy_resizes_itself_and_export_drops_the_hook():
    model = _llama(tied=False, sets=0)
    twin = copy.deepcopy(model)
    twin.resize_token_embeddings(72)
    assert twin.lm_head.weight.shape[0] == 72 and model.lm_head.weight.shape[0] == 64
    exported = perfora.export(twin)
    assert "resize_token_embeddings" not in exported.__dict__
    assert type(exported.lm_head) is torch.nn.Linear
