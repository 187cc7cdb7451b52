"""Neurons grow through InstanceNorm and GroupNorm as through BatchNorm: the norm gains the
new channels (GroupNorm: whole groups) with neutral parameters, the model computes the same
bits, a rewind gives the channels back, export gives plain norms of the new size, and the
controller rounds a step up to whole groups (a resumed run through them:
tests/unit/growth/test_neuron_growth.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import perfora
from perfora.errors import PerforationError
from tests.support.widening import one_neuron_step, widened_and_rewound

NORMS = {
    "groupnorm": lambda: nn.GroupNorm(4, 8),
    "instancenorm": lambda: nn.InstanceNorm2d(8, affine=True, track_running_stats=True),
    "instancenorm-plain": lambda: nn.InstanceNorm2d(8),
}


def _cnn(norm: nn.Module) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), norm, nn.SiLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 4 * 4, 5))


class _ResnetBlock(nn.Module):
    """A diffusion U-Net's residual block: norm, activation, conv, twice, plus the input."""

    def __init__(self, channels: int = 8, groups: int = 2) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(groups, channels), nn.GroupNorm(groups, channels)
        self.act1, self.act2 = nn.SiLU(), nn.SiLU()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(self.act1(self.norm1(x)))
        return x + self.conv2(self.act2(self.norm2(h)))


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("norm", sorted(NORMS))
def test_a_cnn_widens_through_the_norm_with_the_same_bits(norm, train):
    model = _cnn(NORMS[norm]()).train(train)
    x = torch.randn(4, 3, 8, 8)
    before, after = copy.deepcopy(model), copy.deepcopy(model)
    perfora.widen(after, "0", 4)
    assert torch.equal(after(x), before(x))
    grown = after[1]
    assert after[0].out_channels == 12 and after[5].in_features == 12 * 16
    if grown.weight is not None:  # the new channels' affine parameters are neutral
        assert torch.equal(grown.weight[8:], torch.ones(4))
        assert torch.equal(grown.bias[8:], torch.zeros(4))
    if isinstance(grown, nn.GroupNorm):  # whole groups of the same size: 4 groups of 2 -> 6
        assert (grown.num_groups, grown.num_channels) == (6, 12)
    if getattr(grown, "running_mean", None) is not None:
        # the old channels' running statistics moved as the narrow norm's did
        assert torch.equal(grown.running_mean[:8], before[1].running_mean)
        assert torch.equal(grown.running_var[:8], before[1].running_var)


def test_a_groupnorm_takes_neurons_only_in_whole_groups():
    model = _cnn(nn.GroupNorm(2, 8))  # groups of 4 channels
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    with pytest.raises(PerforationError, match="multiples of 4.*not 6"):
        perfora.widen(model, "0", 6)
    assert {k: v.shape for k, v in model.state_dict().items()} == shapes  # nothing changed
    perfora.widen(model, "0", 8)
    assert (model[1].num_groups, model[1].num_channels) == (4, 16)


@pytest.mark.parametrize("norm", sorted(NORMS))
def test_a_rewind_gives_the_norm_its_channels_back(norm):
    model = perfora.perforate(_cnn(NORMS[norm]())).eval()

    def widen_twice(m: nn.Module) -> None:
        perfora.widen(m, "0", 4)
        perfora.widen(m, "0", 8)

    before, after = widened_and_rewound(model, torch.randn(2, 3, 8, 8), widen_twice)
    assert torch.equal(after, before)
    assert type(model[1]) is type(NORMS[norm]())  # the plain class again
    assert model[1].weight is None or model[1].weight.shape == (8,)


@pytest.mark.parametrize("norm", sorted(NORMS))
def test_a_widened_norm_exports_and_reloads(norm, tmp_path):
    model = perfora.perforate(_cnn(NORMS[norm]()))
    x = torch.randn(2, 3, 8, 8)
    perfora.widen(model, "0", 4)
    model.train()(x)  # running statistics of the new channels move too
    model.eval()
    exported = perfora.export(model)
    plain = exported[1]
    assert type(plain) is type(NORMS[norm]())
    if isinstance(plain, nn.GroupNorm):
        assert (plain.num_groups, plain.num_channels) == (6, 12)
    with torch.no_grad():
        torch.testing.assert_close(exported(x), model(x))
    perfora.save_model(tmp_path / "m.safetensors", model)
    loaded = perfora.load_model(perfora.perforate(_cnn(NORMS[norm]())),
                                tmp_path / "m.safetensors").eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_a_diffusion_resnet_block_widens_its_inner_conv_found_by_torch_fx():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), _ResnetBlock(), nn.Conv2d(8, 2, 1))
    plan = perfora.plan_widening(model)
    assert plan.layers["1.conv1"].consumers == [("1.conv2", 1)]
    assert ("1.norm2", 1) in plan.layers["1.conv1"].through
    assert "residual" in plan.refused["1.conv2"]  # the residual stream keeps its width
    x = torch.randn(2, 3, 8, 8)
    for train in (False, True):
        model.train(train)
        before = copy.deepcopy(model)
        perfora.widen(model, "1.conv1", 4)
        assert torch.equal(model(x), before(x))
    assert (model[1].norm2.num_groups, model[1].norm2.num_channels) == (4, 16)


def test_the_controller_rounds_a_neuron_step_up_to_whole_groups():
    # 6 channels in groups of 3: neurons_per_step=0.5 asks for 3 neurons, a whole group
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.GroupNorm(2, 6), nn.ReLU(), nn.Conv2d(6, 6, 3),
        nn.GroupNorm(3, 6), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 36, 3)))
    x = torch.randn(4, 3, 8, 8)
    decision, before = one_neuron_step(model, x, neurons_per_step=0.5)
    assert decision.restructured, decision.reason
    grown = decision.model
    with torch.no_grad():
        assert torch.equal(grown(x), before)
    # the first conv's norm has groups of 3: +3 as asked; the second's groups of 2: 3 -> 4
    assert "0: +3 random" in decision.reason and "3: +4 random" in decision.reason
    assert grown[1].num_channels == 9 and grown[4].num_channels == 10
    assert grown[4].num_groups == 5


def test_a_conv_wrapped_with_its_groupnorm_widens_in_whole_groups_with_dendrites():
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.ReLU(),
                                            nn.Conv2d(8, 2, 3)), groups=[("0", "1")]).eval()
    x = torch.randn(2, 3, 9, 9)
    before = model(x)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    with pytest.raises(PerforationError, match="multiples of 4"):
        perfora.widen(model, "0", 3)
    assert {k: v.shape for k, v in model.state_dict().items()} == shapes  # nothing changed
    perfora.widen(model, "0", 4)
    for layer in perfora.dendritic_layers(model).values():
        layer.grow(torch.Generator().manual_seed(0))
    perfora.widen(model, "0", 4)
    assert torch.equal(model(x), before)
    assert (model[0].base[1].num_groups, model[0].base[1].num_channels) == (4, 16)


class _BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d in miniature: a BatchNorm whose forward also applies an activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(super().forward(x))


class _GroupNormAct(nn.GroupNorm):
    """BiT's BitGroupNormActivation in miniature."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(super().forward(x))


@pytest.mark.parametrize("norm", [_BatchNormAct(8), _GroupNormAct(2, 8)],
                         ids=["batchnorm-act", "groupnorm-act"])
def test_a_norm_with_a_forward_of_its_own_is_refused_not_split(norm):
    # the block-wise norm would replace the subclass's forward and drop its activation
    model = _cnn(norm)
    why = perfora.plan_widening(model).refused["0"]
    assert f"1 ({type(norm).__name__}) is a" in why and "forward of its own" in why
    pairs = {"0": ["1", "2", "3", ("5", 16)]}
    assert "forward of its own" in perfora.plan_widening(model, pairs=pairs).refused["0"]
    with pytest.raises(PerforationError, match="forward of its own"):
        perfora.widen(model, "0", 4)
