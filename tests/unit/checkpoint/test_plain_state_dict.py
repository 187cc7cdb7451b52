"""A plain model's own checkpoint (pretrained weights) loads into the model after perforate:
the wrapped layers take their plain keys, grouped norms included, with strict=True, and the
outputs are the plain model's exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 36, 8), nn.Tanh(), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn1(self.conv1(x))))


@pytest.fixture
def pretrained() -> Net:
    torch.manual_seed(0)
    net = Net()
    for _ in range(3):  # running statistics that differ from a fresh norm's
        net(torch.randn(8, 3, 8, 8))
    return net.eval()


X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("groups", [[], [("conv1", "bn1")]])
@pytest.mark.parametrize("strict", [True, False])
def test_a_plain_checkpoint_loads_into_the_perforated_model(pretrained, groups, strict):
    torch.manual_seed(5)
    model = perfora.perforate(Net(), groups=groups).eval()
    result = model.load_state_dict(pretrained.state_dict(), strict=strict)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(model(X), pretrained(X))  # strict=False used to load nothing


def test_under_a_wrapper_prefix_and_after_growth(pretrained):
    torch.manual_seed(5)
    wrapper = nn.Sequential()
    wrapper.add_module("module", perfora.perforate(Net(), groups=[("conv1", "bn1")]))
    wrapper.load_state_dict({f"module.{k}": v for k, v in pretrained.state_dict().items()})
    grown = wrapper.module.eval()
    for layer in perfora.dendritic_layers(grown).values():
        layer.grow(torch.Generator().manual_seed(0))
    assert torch.equal(grown(X), pretrained(X))  # growth keeps the loaded outputs


def test_a_perfora_checkpoint_still_loads_as_it_was_saved(pretrained):
    torch.manual_seed(5)
    source = perfora.perforate(Net(), groups=[("conv1", "bn1")]).eval()
    source.load_state_dict(pretrained.state_dict())
    for layer in perfora.dendritic_layers(source).values():
        layer.grow(torch.Generator().manual_seed(0))
    target = perfora.perforate(Net(), groups=[("conv1", "bn1")]).eval()
    target.load_state_dict(source.state_dict())
    assert torch.equal(target(X), source(X))
    assert not perfora.export(target)._load_state_dict_pre_hooks  # nothing of perfora's left
