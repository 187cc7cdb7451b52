"""Tied weights: an lm_head that shares its weight with the embedding is left alone by
default (with a report line), and grown with the tie kept when named in paths=; either way
save_pretrained works and the saved model reloads equal."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

import perfora  # noqa: E402
from perfora.integrations.transformers import load_grown_pretrained  # noqa: E402
from tests.support.zoo import CONV1D, hf_models  # noqa: E402

ZOO = {z.name: z for z in hf_models()}


@pytest.mark.parametrize("name", ["llama-tied", "gpt2"])
def test_default_perforate_leaves_a_tied_lm_head_alone_and_says_how_to_grow_it(name, caplog,
                                                                               tmp_path):
    zoo = ZOO[name]
    model = zoo.build()
    with caplog.at_level("INFO", logger="perfora"):
        perfora.perforate(model, **zoo.perforate_kwargs)
    assert "lm_head" not in perfora.dendritic_layers(model)
    assert "skipped lm_head: its weight is tied (lm_head.weight is " in caplog.text
    assert "paths=['lm_head']" in caplog.text
    model.save_pretrained(tmp_path)  # raised "shared tensors" when lm_head was wrapped


def test_gpt2_default_selection_wraps_its_conv1d_layers_with_their_widths():
    # it wrapped nothing ("nothing to perforate"): GPT-2 needed names=["Conv1D"],
    # neuron_axes={"Conv1D": -1} and an example input
    model = perfora.perforate(ZOO["gpt2"].build())
    layers = perfora.dendritic_layers(model)
    assert {path.rpartition(".")[2] for path in layers} == {"c_attn", "c_proj", "c_fc"}
    assert len(layers) == 8 and "lm_head" not in layers
    c_fc = layers["transformer.h.0.mlp.c_fc"]
    assert (c_fc.num_neurons, c_fc.neuron_axis) == (c_fc.source.nf, -1)
    assert perfora.plan_widening(model).layers["transformer.h.0.mlp.c_fc"].widenable


@pytest.mark.parametrize("name", ["llama-tied", "gpt2"])
def test_lm_head_named_in_paths_grows_with_the_tie_kept_and_saves(name, tmp_path):
    zoo = ZOO[name]
    kwargs = dict(zoo.perforate_kwargs)
    if name == "gpt2":
        kwargs = {**kwargs, "names": CONV1D["names"], "paths": ["lm_head"]}
    else:
        kwargs = {"types": (torch.nn.Linear,), "paths": ["lm_head"]}
    model = perfora.perforate(zoo.build(), **kwargs)
    embed = model.get_input_embeddings().weight
    assert model.lm_head.base.weight is embed
    gen = torch.Generator().manual_seed(0)
    for layer in perfora.dendritic_layers(model).values():
        layer.grow(gen)
        with torch.no_grad():
            layer.out_weight.fill_(0.1)
    model.save_pretrained(tmp_path)
    fresh = load_grown_pretrained(zoo.build(), tmp_path, **kwargs).eval()
    assert fresh.lm_head.base.weight is fresh.get_input_embeddings().weight
    ids = zoo.inputs()["input_ids"]
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=ids).logits, model.eval()(input_ids=ids).logits)
