"""Neuron growth through a depthwise conv (MobileNet's and EfficientNet's inverted residual
blocks): the expanding conv gains channels, the depthwise conv after it gains channels of its
own, the projection reads them through zero columns. The output keeps its bits, a rewind gives
everything back, and the widened model saves, loads, exports and trains under the controller."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import perfora
from perfora.integrations.transformers import load_grown_pretrained
from perfora.nn.narrowing import narrow_widenings
from tests.support.zoo import hf_models

X = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def _chain(dw: nn.Module | None = None) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.ReLU6(),
        dw if dw is not None else nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.BatchNorm2d(8), nn.ReLU6(), nn.Conv2d(8, 4, 1))


class _Functional(nn.Module):
    """Found by torch.fx: relu functions between the layers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.expand = nn.Conv2d(3, 8, 1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, padding_mode="reflect")
        self.project = nn.Conv2d(8, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(torch.relu(self.dw(torch.relu(self.expand(x)))))


class _TorchvisionStyle(nn.Module):
    """torchvision's InvertedResidual: Sequentials of (conv, BN, act) inside a Sequential,
    then a residual add that fx finds after the projection."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 12, 1, bias=False), nn.BatchNorm2d(12), nn.SiLU()),
            nn.Sequential(nn.Conv2d(12, 12, 3, stride=2, padding=1, groups=12, bias=False),
                          nn.BatchNorm2d(12), nn.SiLU()),
            nn.Conv2d(12, 3, 1, bias=False), nn.BatchNorm2d(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.avg_pool2d(x, 2) + self.conv(x)


CASES = {
    "sequential": (lambda: _chain(), "0", "3", "6"),
    "fx-reflect-padding": (_Functional, "expand", "dw", "project"),
    "torchvision-style": (_TorchvisionStyle, "conv.0.0", "conv.1.0", "conv.2"),
}


def _depthwise(model: nn.Module, path: str) -> nn.Conv2d:
    module = model.get_submodule(path)
    return module.source if isinstance(module, perfora.DendriticLayer) else module


@pytest.mark.parametrize("perforated", [False, True], ids=["plain", "perforated"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_widening_passes_a_depthwise_conv_with_the_output_bit_identical(case, perforated):
    build, producer, dw, reader = CASES[case]
    model = build()
    if perforated:
        model = perfora.perforate(model)
    entry = perfora.plan_widening(model).layers[producer]
    assert entry.widenable, entry.reason
    assert entry.consumers == [(reader, 1)] and dw in [p for p, _ in entry.through]
    width = _depthwise(model, dw).in_channels
    for mode in ("eval", "train"):  # train: BatchNorm's batch statistics per block
        getattr(model, mode)()
        with torch.no_grad():
            before = model(X)
            perfora.widen(model, producer, 3)
            assert torch.equal(model(X), before), mode
            conv = _depthwise(model, dw)
            assert (conv.in_channels, conv.out_channels, conv.groups) == (width + 3,) * 3
            assert conv.weight[width:].abs().sum() > 0  # new filters: random, not zero
            narrow_widenings(model, producer, 0)
            assert torch.equal(model(X), before), mode
            assert type(_depthwise(model, dw)) is nn.Conv2d
            assert _depthwise(model, dw).weight.shape[0] == width


def test_the_new_channels_train_from_the_next_step():
    model = _chain().train()
    perfora.widen(model, "0", 2)
    nn.functional.mse_loss(model(X), torch.ones(4, 4, 8, 8)).backward()
    assert model[6].weight.grad[:, 8:].abs().sum() > 0  # the reader's new zero columns
    assert model[0].weight.grad[8:].abs().sum() == 0  # nothing reaches them yet


def _with_dendrites(model: nn.Module, sets: int) -> None:
    """``sets`` dendrite sets on every layer, each feeding the output (nonzero v)."""
    for layer in perfora.dendritic_layers(model).values():
        for _ in range(sets):
            layer.grow()
        with torch.no_grad():
            layer.out_weight.normal_(0, 0.1)


@pytest.mark.parametrize("sets", [1, 2])
def test_a_dendritic_depthwise_conv_gains_rows_for_its_new_channels_and_gives_them_back(sets):
    model = perfora.perforate(_chain()).eval()
    _with_dendrites(model, sets)
    dw = model[3]
    bank = dw.bank_weight.detach().clone()
    with torch.no_grad():
        before = model(X)
        perfora.widen(model, "0", 3)
        assert torch.equal(model(X), before)
        assert dw.num_neurons == 11 and dw.bank_weight.shape[0] == 11 * sets
        assert tuple(dw.out_weight.shape) == (sets, 11) and not dw.out_weight[:, 8:].any()
        # the bank is laid out group by group: the old groups' rows are where they were
        assert torch.equal(dw.bank_weight[:8 * sets], bank)
        dw.grow()  # a set grown after the widening feeds every channel, the new ones too
        assert torch.equal(model(X), before)
        narrow_widenings(model, "0", 0)
        assert torch.equal(model(X), before)
        assert dw.num_neurons == 8 and dw.bank_weight.shape[0] == 8 * (sets + 1)
        assert torch.equal(dw.bank_weight.unflatten(0, (8, sets + 1, 1))[:, :sets].flatten(0, 2),
                           bank)


@pytest.mark.parametrize("dw, reason", [
    (nn.Conv2d(8, 8, 3, padding=1, groups=2),
     "its output goes to 3, a grouped convolution (groups=2, 8 in, 8 out): a widening passes "
     "only through a depthwise conv with one output per input channel"),
    (nn.Conv2d(8, 16, 3, padding=1, groups=8),
     "its output goes to 3, a grouped convolution (groups=8, 8 in, 16 out): a widening passes "
     "only through a depthwise conv with one output per input channel"),
], ids=["grouped", "channel-multiplier-2"])
def test_other_grouped_convs_are_refused_with_the_reason_before_any_change(dw, reason):
    model = _chain(dw)
    if dw.out_channels == 16:
        model[4], model[6] = nn.BatchNorm2d(16), nn.Conv2d(16, 4, 1)
    model = perfora.perforate(model)
    assert perfora.plan_widening(model).refused["0"] == reason
    with pytest.raises(perfora.PerforationError, match="a widening passes only through"):
        perfora.widen(model, "0", 2)
    assert model[0].num_neurons == 8 and model[3].source.in_channels == 8


def test_widening_the_depthwise_conv_itself_says_to_widen_the_layer_that_feeds_it():
    model = perfora.perforate(_chain())
    with pytest.raises(perfora.PerforationError, match=r"'3' is a grouped convolution, which "
                                                       r"cannot gain neurons of its own"):
        perfora.widen(model, "3", 2)
    assert model[3].source.groups == 8


def test_a_widened_depthwise_model_saves_loads_and_exports(tmp_path):
    model = perfora.perforate(_chain())
    _with_dendrites(model, 1)
    perfora.widen(model, "0", 3)
    model.eval()
    with torch.no_grad():
        expected = model(X)
    perfora.save_model(tmp_path / "m.safetensors", model)
    loaded = perfora.load_model(_chain(), tmp_path / "m.safetensors").eval()
    with torch.no_grad():
        assert torch.equal(loaded(X), expected)
    exported = perfora.export(model).eval()
    assert not perfora.dendritic_layers(exported)
    conv = exported[3].base  # a layer with a dendrite set exports as its base and its bank
    assert type(conv) is nn.Conv2d and conv.groups == conv.in_channels == 11
    with torch.no_grad():
        assert torch.allclose(exported(X), expected, atol=1e-5, rtol=1e-5)


def test_the_controller_grows_through_a_depthwise_conv_and_rewinds_to_the_best_model():
    model = perfora.perforate(_chain())
    y = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=2, write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()

    def epoch(m: nn.Module, o: torch.optim.Optimizer) -> None:
        m.train()
        o.zero_grad()
        nn.functional.mse_loss(m(X), y).backward()
        o.step()
        m.eval()

    epoch(model, opt)
    with torch.no_grad():
        best = model(X)
    moments = opt.state[model[3].source.weight]["exp_avg"].clone()
    decision = ctl.step(0.9)  # the best score: every later step is worse
    assert decision.restructured and "0: +8" in decision.reason, decision.reason
    grown = decision.model
    assert _depthwise(grown, "3").groups == 16 and grown[6].base.in_channels == 16
    with torch.no_grad():
        assert torch.equal(grown(X), best)
    carried = decision.optimizer.state[grown[3].source.weight]["exp_avg"]
    assert torch.equal(carried[:8], moments) and not carried[8:].any()
    for score in (0.5, 0.4):
        epoch(decision.model, decision.optimizer)
        decision = ctl.step(score)
    assert decision.complete
    with torch.no_grad():
        assert torch.equal(decision.model(X), best)
    assert _depthwise(decision.model, "3").groups == 8


def test_a_widened_hf_mobilenet_v2_reloads_from_save_pretrained(tmp_path):
    zoo = next(m for m in hf_models() if m.name == "hf-mobilenet-v2")
    model = perfora.perforate(zoo.build(), **zoo.perforate_kwargs).eval()
    plan = perfora.plan_widening(model)
    expand = "mobilenet_v2.layer.3.expand_1x1.convolution"
    assert plan.layers[expand].found_by == "MobileNet inverted residual"
    batch = zoo.inputs()
    with torch.no_grad():
        before = zoo.output(model(**batch))
        perfora.widen(model, expand, 5)
        assert torch.equal(zoo.output(model(**batch)), before)
    assert model.mobilenet_v2.layer[3].conv_3x3.convolution.source.groups == \
        model.mobilenet_v2.layer[3].reduce_1x1.convolution.source.in_channels
    model.save_pretrained(tmp_path)
    loaded = load_grown_pretrained(zoo.build(), tmp_path, **zoo.perforate_kwargs)
    with torch.no_grad():
        assert torch.allclose(zoo.output(loaded.eval()(**batch)), before, atol=1e-5, rtol=1e-5)


def test_mobilevit_widens_its_inverted_residual_blocks_exactly():
    from transformers import MobileViTConfig, MobileViTForImageClassification

    torch.manual_seed(0)
    model = perfora.perforate(MobileViTForImageClassification(MobileViTConfig(
        image_size=32, patch_size=2, hidden_sizes=[16, 24, 32], num_attention_heads=2,
        neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32], num_labels=3))).eval()
    plan = perfora.plan_widening(model)
    blocks = [p for p, e in plan.layers.items() if e.found_by == "MobileNet inverted residual"
              and e.widenable]
    assert len(blocks) == 7 and all(p.endswith("expand_1x1.convolution") for p in blocks)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    # the blocks, and the Transformer layers' feed-forwards, widen and narrow back exactly
    _widen_all_and_back(model, plan.widenable, 3, lambda: model(pixel_values=pixels).logits)


def _widen_all_and_back(model: nn.Module, paths: list[str], k: int,
                        run: Callable[[], torch.Tensor],
                        widened: Callable[[], None] = lambda: None) -> None:
    """Widen every path by k and narrow them back: the output is torch.equal to before at
    both ends; ``widened`` checks the widened model in between."""
    with torch.no_grad():
        before = run()
        for path in paths:
            perfora.widen(model, path, k)
        assert torch.equal(run(), before)
        widened()
        for path in paths:
            narrow_widenings(model, path, 0)
        assert torch.equal(run(), before)


def _efficientnet() -> nn.Module:
    return next(m for m in hf_models() if m.name == "hf-efficientnet").build()


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_efficientnet_widens_through_its_squeeze_excitation_and_narrows_back_exactly(mode):
    model = perfora.perforate(_efficientnet())
    getattr(model, mode)()
    plan = perfora.plan_widening(model)
    entry = plan.layers["efficientnet.encoder.blocks.1.expansion.expand_conv"]
    assert entry.found_by == "EfficientNet block" and len(plan.widenable) == 13
    assert entry.partners == ["efficientnet.encoder.blocks.1.squeeze_excite.expand"]
    # the squeeze-excitation bottlenecks widen too (found in each gate's own graph)
    gate = plan.layers["efficientnet.encoder.blocks.1.squeeze_excite.reduce"]
    assert gate.widenable and gate.found_by == "torch.fx (EfficientNetSqueezeExciteLayer)"
    assert gate.consumers == [("efficientnet.encoder.blocks.1.squeeze_excite.expand", 1)]
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    block = model.efficientnet.encoder.blocks[1]

    def gates_live_and_read_by_zero_columns() -> None:
        # the new channels' gates are live (random rows), their product read by zero columns
        assert block.squeeze_excite.expand.source.weight[-3:].abs().sum() > 0
        assert not block.projection.project_conv.source.weight[:, -3:].any()
        # (its own 3 new rows, from the bottleneck's widening, read every channel)
        assert not block.squeeze_excite.reduce.source.weight[:-3, -3:].any()

    _widen_all_and_back(model, plan.widenable, 3, lambda: model(pixel_values=pixels).logits,
                        gates_live_and_read_by_zero_columns)
    assert block.squeeze_excite.expand.num_neurons == 48
    assert type(block.depthwise_conv.depthwise_act) is not perfora.nn.blocks.Blockwise


def test_the_controller_grows_an_efficientnet_that_trains_on():
    model = perfora.perforate(_efficientnet())
    pixels = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([0, 1, 2, 0])
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, neurons_per_step=0.25,
                                   write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    opt, _ = ctl.build_optimizer()

    def loss_of(m: nn.Module) -> torch.Tensor:
        return nn.functional.cross_entropy(m(pixel_values=pixels).logits, labels)

    model.train()
    loss_of(model).backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        before = model(pixel_values=pixels).logits
    decision = ctl.step(0.5)
    assert decision.restructured and "expansion.expand_conv: +12 random" in decision.reason
    grown = decision.model
    with torch.no_grad():
        assert torch.equal(grown(pixel_values=pixels).logits, before)
    grown.train()
    losses = []
    for _ in range(3):
        decision.optimizer.zero_grad()
        loss = loss_of(grown)
        loss.backward()
        decision.optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
    grown.eval()
    exported = perfora.export(grown).eval()
    with torch.no_grad():
        assert torch.allclose(exported(pixel_values=pixels).logits,
                              grown(pixel_values=pixels).logits, atol=1e-5, rtol=1e-5)


class _ConvNormAct(nn.Sequential):
    """torchvision's Conv2dNormActivation: conv, BatchNorm, activation (none for a projection)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, groups: int = 1,
                 act: type[nn.Module] | None = nn.Hardswish) -> None:
        layers = [nn.Conv2d(c_in, c_out, k, padding=(k - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(c_out)]
        super().__init__(*layers, *([act()] if act else []))


class SqueezeExcitation(nn.Module):
    """torchvision's squeeze-excitation module, as MobileNetV3 and EfficientNet use it."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._scale(x) * x


class _MobileNetV3Block(nn.Module):
    """torchvision's MobileNetV3 InvertedResidual with squeeze-excitation."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(_ConvNormAct(8, 24), _ConvNormAct(24, 24, 3, groups=24),
                                   SqueezeExcitation(24, 8), _ConvNormAct(24, 8, act=None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.block(x)
        result += x
        return result


def _mobilenet_v3_like() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(_ConvNormAct(3, 8, 3), _MobileNetV3Block(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 3))


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_torch_fx_follows_a_widening_through_a_squeeze_excitation_gate(mode):
    model = perfora.perforate(_mobilenet_v3_like())
    getattr(model, mode)()
    plan = perfora.plan_widening(model)
    entry = plan.layers["1.block.0.0"]
    assert entry.widenable and entry.found_by == "torch.fx", entry.reason
    assert entry.partners == ["1.block.2.fc2"]
    assert sorted(p for p, _ in entry.consumers) == ["1.block.2.fc1", "1.block.3.0"]
    assert "1.block.2.scale_activation" in [p for p, _ in entry.through]
    assert plan.layers["1.block.2.fc1"].widenable  # the gate's own pair

    def gate_widened() -> None:
        assert model[1].block[2].fc2.source.weight.shape[0] == 28

    _widen_all_and_back(model, plan.widenable, 4, lambda: model(X), gate_widened)
    assert model[1].block[2].fc2.source.weight.shape[0] == 24


def test_a_product_that_is_not_a_gate_of_the_same_tensor_is_refused():
    class _OtherGate(SqueezeExcitation):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x's gate scales another tensor
            return self._scale(x) * torch.relu(x)

    model = _mobilenet_v3_like()
    model[1].block[2] = _OtherGate(24, 8)
    reason = perfora.plan_widening(perfora.perforate(model)).refused["1.block.0.0"]
    assert reason.startswith("its output goes to mul (call_function), which a widening "
                             "cannot follow"), reason


def test_a_widened_efficientnet_reloads_from_save_model_and_save_pretrained(tmp_path):
    zoo = next(m for m in hf_models() if m.name == "hf-efficientnet")
    model = perfora.perforate(zoo.build()).eval()
    batch = zoo.inputs()
    perfora.widen(model, "efficientnet.encoder.blocks.2.expansion.expand_conv", 4)
    with torch.no_grad():
        expected = zoo.output(model(**batch))
    perfora.save_model(tmp_path / "m.safetensors", model)
    loaded = perfora.load_model(zoo.build(), tmp_path / "m.safetensors").eval()
    with torch.no_grad():
        assert torch.equal(zoo.output(loaded(**batch)), expected)  # replayed, bit for bit
    model.save_pretrained(tmp_path / "hf")
    reloaded = load_grown_pretrained(zoo.build(), tmp_path / "hf").eval()
    gates = [m.efficientnet.encoder.blocks[2].squeeze_excite.expand for m in (reloaded, model)]
    assert gates[0].num_neurons == gates[1].num_neurons
    with torch.no_grad():
        assert torch.allclose(zoo.output(reloaded(**batch)), expected, atol=1e-5, rtol=1e-5)


class _Untraceable(nn.Module):
    """A depthwise block torch.fx cannot trace (a branch on the input's values)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.expand, self.bn = nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8)
        self.dw, self.project = nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dw(torch.relu(self.bn(self.expand(x))))
        return self.project(h if bool(x.sum() > -1e9) else -h)


def test_pairs_name_a_depthwise_conv_on_the_way_and_cannot_leave_it_out():
    model = perfora.perforate(_Untraceable()).eval()
    assert "pass pairs=" in perfora.plan_widening(model).refused["expand"]
    with torch.no_grad():
        before = model(X)
    perfora.widen(model, "expand", 2, pairs={"expand": ["bn", "dw", "project"]})
    with torch.no_grad():
        assert torch.equal(model(X), before)
    assert model.dw.source.groups == 10
    chain = perfora.perforate(_chain())
    with pytest.raises(perfora.PerforationError, match=r"pairs\['0'\] leaves out 3, which"):
        perfora.widen(chain, "0", 2, pairs={"0": ["1", "4", "6"]})
    assert chain[3].source.groups == 8  # refused before anything changed
    with pytest.raises(perfora.PerforationError, match="pairs: its output goes to 3, a grouped"):
        perfora.widen(perfora.perforate(_chain(nn.Conv2d(8, 8, 3, padding=1, groups=2))), "0",
                      2, pairs={"0": ["1", "3", "4", "6"]})


_CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


@pytest.mark.parametrize("unbatched", [False, True], ids=["batched", "unbatched"])
@pytest.mark.parametrize("padding", ["zeros", "reflect", "same", "strided"])
@pytest.mark.parametrize("dims, layout", [(1, "contiguous"), (2, "contiguous"),
                                          (2, "channels_last"), (3, "contiguous")])
def test_depthwise_growth_keeps_the_bits_in_every_layout(dims, layout, padding, unbatched):
    conv = _CONVS[dims]
    torch.manual_seed(dims)
    if padding == "same":
        dw = conv(6, 6, 3, padding="same", dilation=2, groups=6)
    else:
        dw = conv(6, 6, 3, stride=2 if padding == "strided" else 1, padding=1, groups=6,
                  padding_mode="reflect" if padding == "reflect" else "zeros")
    # 1x1 and depthwise kernels look contiguous in either layout: their strides still count
    model = nn.Sequential(conv(2, 6, 1), nn.SiLU(), dw, nn.ReLU(), conv(6, 3, 1)).eval()
    x = torch.randn(3, 2, *(7,) * dims, generator=torch.Generator().manual_seed(5))
    if layout == "channels_last":
        model, x = model.to(memory_format=torch.channels_last), \
            x.contiguous(memory_format=torch.channels_last)
    x = x[0] if unbatched else x  # unbatched: a channels-last slice keeps its strides
    with torch.no_grad():
        before = model(x)
        perfora.widen(model, "0", 3)
        assert torch.equal(model(x), before)
        if layout == "channels_last":
            assert model[2].weight.is_contiguous(memory_format=torch.channels_last)
        narrow_widenings(model, "0", 0)
        assert torch.equal(model(x), before)


def test_the_plan_refuses_a_depthwise_conv_as_a_layer_of_its_own():
    # the plan of a plain model said "2 -> 4 [torch.fx]", and widen() then raised
    plan = perfora.plan_widening(_chain())
    assert plan.refused["3"].startswith("a grouped convolution (groups=8) cannot gain neurons "
                                        "of its own")
    assert plan.layers["0"].widenable
    with pytest.raises(perfora.PerforationError, match="grouped conv"):
        perfora.widen(_chain(), "3", 4)
