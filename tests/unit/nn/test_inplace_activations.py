"""An in-place activation after a grown layer (``ReLU(inplace=True)``, torchvision's
``Hardswish(inplace=True)``) trains exactly as its out-of-place twin does: the fused
dendrite mix and the correlation rule's tap must not hand autograd a view it forbids to
change in place ("Output 0 of FusedMix is a view and is being modified inplace")."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import perfora

ACTIVATIONS = [nn.ReLU, nn.Hardswish, nn.SiLU]


def _linear(act: type[nn.Module], inplace: bool) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), act(inplace=inplace), nn.Linear(8, 3))


def _conv(act: type[nn.Module], inplace: bool) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), act(inplace=inplace), nn.Conv2d(8, 3, 3))


def _grown(build, act: type[nn.Module], inplace: bool) -> nn.Module:
    model = perfora.perforate(build(act, inplace)).train()
    for layer in perfora.dendritic_layers(model).values():
        for seed in (1, 2):
            layer.grow(torch.Generator().manual_seed(seed))
        with torch.no_grad():
            layer.out_weight.fill_(0.1)
    return model


def _grads(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out = model(x)
    out.square().mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda a: a.__name__)
@pytest.mark.parametrize("kind,x", [
    ("linear", torch.randn(4, 6, generator=torch.Generator().manual_seed(5))),
    ("linear-3d", torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(5))),
    ("conv", torch.randn(2, 3, 7, 7, generator=torch.Generator().manual_seed(5))),
])
def test_a_grown_layer_feeds_an_inplace_activation_with_the_same_gradients(act, kind, x):
    build = _conv if kind == "conv" else _linear
    out_a, grads_a = _grads(_grown(build, act, inplace=True), x)
    out_b, grads_b = _grads(_grown(build, act, inplace=False), x)
    assert torch.equal(out_a, out_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


def _controller_run(inplace: bool, **settings) -> nn.Module:
    model = perfora.perforate(_linear(nn.ReLU, inplace))
    ctl = perfora.GrowthController(model, switch_mode="every_epoch", write_files=False,
                                   **settings)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 6, generator=gen)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    for epoch in range(4):
        model.train()
        for i in range(4):
            rows = slice(16 * i, 16 * i + 16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
            opt.step()
        model.eval()
        decision = ctl.step(0.5 + 0.1 * epoch)  # each a new best: every growth kept
        model, opt = decision.model, decision.optimizer
        if decision.complete:
            break
    return model


@pytest.mark.parametrize("settings", [
    dict(rule="correlation", max_dendrites=2),
    dict(growth="neurons", neuron_init="gradmax", max_neuron_steps=2),
    dict(growth="dendrites", max_dendrites=2),
], ids=["correlation", "neurons-gradmax", "dendrites"])
def test_the_controller_grows_alike_with_an_inplace_relu(settings):
    grown = _controller_run(True, **settings)
    twin = _controller_run(False, **copy.deepcopy(settings))
    start = sum(p.numel() for p in _linear(nn.ReLU, False).parameters())
    assert sum(p.numel() for p in grown.parameters()) > start  # it grew
    a, b = grown.state_dict(), twin.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
