"""load_grown_pretrained reads a folder under the names transformers loads it by: transformers
5 saves ViT under its legacy key names (``attention.attention.query``) and renames them as it
loads, and load_grown_pretrained failed on them (strict load: missing and unexpected keys),
grown or not."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

import perfora  # noqa: E402
from perfora.integrations.transformers import load_grown_pretrained  # noqa: E402
from tests.support.zoo import hf_models  # noqa: E402

VIT = next(z for z in hf_models() if z.name == "hf-vit")


@pytest.mark.parametrize("grown", ["nothing", "dendrites", "neurons and dendrites"])
def test_a_saved_vit_loads_into_a_fresh_one_with_equal_outputs(tmp_path, grown):
    model = perfora.perforate(VIT.build(), **VIT.perforate_kwargs).eval()
    gen = torch.Generator().manual_seed(0)
    if "neurons" in grown:
        for path in perfora.plan_widening(model).widenable:
            perfora.widen(model, path, 8, generator=gen)
    if "dendrites" in grown:
        for layer in perfora.dendritic_layers(model).values():
            layer.grow(gen)
            with torch.no_grad():
                layer.out_weight.fill_(0.1)
    model.save_pretrained(tmp_path)
    fresh = load_grown_pretrained(VIT.build(), tmp_path, **VIT.perforate_kwargs).eval()
    pixels = VIT.inputs()["pixel_values"]
    with torch.no_grad():
        torch.testing.assert_close(fresh(pixel_values=pixels).logits,
                                   model(pixel_values=pixels).logits, rtol=0, atol=1e-6)
