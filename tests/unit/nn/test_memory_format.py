"""A grown conv keeps its base output's memory format. With a channels_last input (timm's
ConvNeXt feeds its 1x1 convs one, from a permuted LayerNorm) the fused mix of two or more
dendrite sets used to return a contiguous tensor: the next layer then computed in another
layout and rounded differently, so growth changed the model's output (by 4e-7 here)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora


def _model() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(nn.Sequential(
        nn.Conv2d(64, 256, 1), nn.GELU(), nn.Conv2d(256, 64, 1),
        nn.Conv2d(64, 64, 7, padding=3, groups=64)))


X = torch.randn(2, 64, 7, 7, generator=torch.Generator().manual_seed(1)).contiguous(
    memory_format=torch.channels_last)


@pytest.mark.parametrize("sets", [1, 2, 3])
def test_growth_of_a_channels_last_conv_leaves_the_output_bit_identical(sets):
    model = _model().eval()
    with torch.no_grad():
        before = model(X)
    for layer in perfora.dendritic_layers(model).values():
        for seed in range(sets):
            layer.grow(torch.Generator().manual_seed(10 + seed))
    with torch.no_grad():
        assert torch.equal(model(X), before)
        grown = model[0](X)
        assert grown.is_contiguous(memory_format=torch.channels_last)
        assert grown.stride() == model[0].base(X).stride()


def test_a_channels_last_grown_conv_trains_with_the_gradients_of_a_contiguous_one():
    grads = []
    for x in (X, X.contiguous()):
        model = _model().train()
        for layer in perfora.dendritic_layers(model).values():
            for seed in range(2):
                layer.grow(torch.Generator().manual_seed(10 + seed))
            with torch.no_grad():
                layer.out_weight.fill_(0.1)
        model(x).square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_widening_a_channels_last_model_leaves_the_output_bit_identical():
    # the blocks were computed on contiguous (NCHW) copies and joined as NCHW: the narrow
    # layers had run on channels_last, and the next layer rounded differently (3e-8 here)
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(
        nn.Conv2d(16, 32, 1), nn.BatchNorm2d(32), nn.GELU(), nn.Conv2d(32, 16, 3, padding=1),
        nn.SiLU(), nn.Conv2d(16, 16, 1))).eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 7, 7).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        before = model(x)
    plan = perfora.plan_widening(model)
    assert plan.widenable == ["0", "3"]
    for step in range(2):
        for path in plan.widenable:
            perfora.widen(model, path, 3 + step)
        with torch.no_grad():
            out = model(x)
            assert torch.equal(out, before)
            assert model[0](x).is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("neurons", [False, True])
def test_a_channels_last_model_gets_its_dendrite_weights_in_channels_last(neurons):
    # a model moved with .to(memory_format=torch.channels_last) got contiguous (NCHW) bank
    # weights at each growth step: every grown conv mixed two layouts
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Conv2d(8, 16, 3), nn.ReLU(),
                                            nn.Conv2d(16, 8, 3)))
    model = model.to(memory_format=torch.channels_last)
    if neurons:
        perfora.widen(model, "0", 4)
    for layer in perfora.dendritic_layers(model).values():
        layer.grow(torch.Generator().manual_seed(3))
        layer.grow(torch.Generator().manual_seed(4))
    for name, p in model.named_parameters():
        if p.dim() == 4:
            assert p.is_contiguous(memory_format=torch.channels_last) and \
                not p.is_contiguous(), name
