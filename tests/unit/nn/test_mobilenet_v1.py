"""transformers' MobileNetV1: a ModuleList of conv layers, depthwise and pointwise in turn, that
its forward runs in order (the model does not trace). Each pointwise conv, and the stem, gains
channels through the depthwise layer after it (which gains channels of its own) to the next
pointwise conv; the last one, whose output is the model's, is refused. Exact in eval and
training mode, narrowed back, reloaded from ``save_pretrained``, grown by the controller."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora
from perfora.integrations.transformers import load_grown_pretrained
from perfora.nn.narrowing import narrow_widenings

T = pytest.importorskip("transformers", reason="transformers not installed")

PIXELS = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _build() -> nn.Module:
    torch.manual_seed(0)
    model = T.MobileNetV1ForImageClassification(T.MobileNetV1Config(
        image_size=32, depth_multiplier=0.25, num_labels=3))
    with torch.no_grad():  # BatchNorm statistics that are not the identity
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 2.0)
    return model


def _logits(model: nn.Module) -> torch.Tensor:
    return model(pixel_values=PIXELS).logits


def test_the_plan_finds_each_pointwise_conv_and_refuses_the_last():
    plan = perfora.plan_widening(perfora.perforate(_build()))
    widenable = plan.widenable
    assert len(widenable) == 13 and widenable[0] == "mobilenet_v1.conv_stem.convolution"
    entry = plan.layers["mobilenet_v1.layer.1.convolution"]
    assert entry.found_by == "MobileNetV1 layers"
    assert entry.consumers == [("mobilenet_v1.layer.3.convolution", 1)]
    assert ("mobilenet_v1.layer.2.convolution", -3) in entry.through  # the depthwise conv
    assert "last hidden state" in plan.refused["mobilenet_v1.layer.25.convolution"]


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_every_pointwise_conv_widens_exactly_and_narrows_back(mode):
    model = perfora.perforate(_build())
    getattr(model, mode)()
    paths = perfora.plan_widening(model).widenable
    with torch.no_grad():
        before = _logits(model)
        for path in paths:
            perfora.widen(model, path, 3)
        assert torch.equal(_logits(model), before)
        depthwise = model.mobilenet_v1.layer[2].convolution.source
        assert depthwise.groups == depthwise.in_channels == depthwise.out_channels
        for path in paths:
            narrow_widenings(model, path, 0)
        assert torch.equal(_logits(model), before)
    assert model.mobilenet_v1.layer[2].convolution.source.groups == 16


def test_a_widened_mobilenet_v1_reloads_from_save_pretrained(tmp_path):
    model = perfora.perforate(_build()).eval()
    for path in perfora.plan_widening(model).widenable:
        perfora.widen(model, path, 3)
    with torch.no_grad():
        before = _logits(model)
    model.save_pretrained(tmp_path)
    loaded = load_grown_pretrained(_build(), tmp_path).eval()
    with torch.no_grad():
        assert torch.allclose(_logits(loaded), before, atol=1e-5, rtol=1e-5)


def test_the_controller_grows_mobilenet_v1_and_it_trains_on():
    model = perfora.perforate(_build())
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, neuron_init="random",
                                   write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    opt, _ = ctl.build_optimizer()
    labels = torch.tensor([0, 2])
    nn.functional.cross_entropy(_logits(model.train()), labels).backward()
    opt.step()
    with torch.no_grad():
        before = _logits(model.eval())
    decision = ctl.step(0.5)
    assert decision.restructured and "layer.1.convolution: +" in decision.reason
    with torch.no_grad():
        assert torch.equal(_logits(decision.model.eval()), before)
    losses = []
    for _ in range(3):
        decision.optimizer.zero_grad()
        loss = nn.functional.cross_entropy(_logits(decision.model.train()), labels)
        loss.backward()
        decision.optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
