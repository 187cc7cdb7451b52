"""A ConvTranspose that reads a widened conv (a decoder's upsampling, a U-Net's) gains zero
input channels: the model computes the same bits, with or without ``output_size``, a rewind
gives the channels back, export gives a plain ConvTranspose of the new size, and a grown
autoencoder saves and loads onto a freshly built one."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import perfora
from tests.support.widening import one_neuron_step, widened_and_rewound

TRANSPOSED = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
NORMS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}


def _decoder(dims: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(CONVS[dims](3, 8, 3, padding=1), NORMS[dims](8), nn.SiLU(),
                         TRANSPOSED[dims](8, 4, 3, stride=2, padding=1, output_padding=1),
                         nn.ReLU(), CONVS[dims](4, 2, 1))


def _autoencoder() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1),
        nn.ReLU(), nn.ConvTranspose2d(6, 4, 2, stride=2), nn.ReLU(), nn.Conv2d(4, 1, 1)))


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_a_transposed_conv_reading_a_widened_conv_keeps_every_bit(dims, train):
    model = _decoder(dims).train(train)
    x = torch.randn(2, 3, *([6] * dims))
    before, after = copy.deepcopy(model), copy.deepcopy(model)
    perfora.widen(after, "0", 4)
    assert torch.equal(after(x), before(x))
    up = after[3]
    assert up.in_channels == 12 and up.weight.shape[:2] == (12, 4)
    assert not up.weight[8:].any()  # the new input channels' weights are zero
    exported = perfora.export(copy.deepcopy(after).eval())
    assert type(exported[3]) is TRANSPOSED[dims]
    with torch.no_grad():
        torch.testing.assert_close(exported(x), after.eval()(x))


def test_output_size_still_picks_the_output_padding():
    model = _decoder(2)
    model[3] = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1)
    x = torch.randn(2, 3, 8, 8)

    def decode(m: nn.Module) -> torch.Tensor:
        return m[3](m[2](m[1](m[0](x))), output_size=[16, 16])

    want = decode(model)
    perfora.widen(model, "0", 4)
    assert want.shape[-2:] == (16, 16) and torch.equal(decode(model), want)


def test_a_grouped_transposed_conv_is_refused_with_the_reason():
    model = _decoder(2)
    model[3] = nn.ConvTranspose2d(8, 4, 3, groups=2)
    assert "(ConvTranspose2d), whose use of new neurons is unknown" in \
        perfora.plan_widening(model).refused["0"]


def test_a_rewind_gives_the_transposed_conv_its_channels_back():
    model = perfora.perforate(_decoder(2)).eval()

    def widen_twice(m: nn.Module) -> None:
        perfora.widen(m, "0", 4)
        perfora.widen(m, "0", 2)

    before, after = widened_and_rewound(model, torch.randn(2, 3, 6, 6), widen_twice)
    assert torch.equal(after, before)
    assert type(model[3]) is nn.ConvTranspose2d and model[3].in_channels == 8


def test_an_autoencoder_grows_neurons_through_its_decoder_and_reloads(tmp_path):
    x = torch.randn(4, 1, 8, 8)
    decision, before = one_neuron_step(_autoencoder(), x)
    assert decision.reason == "plateau: added neuron step 1 (0: +4 random, 2: +6 random)"
    grown = decision.model
    assert grown[4].in_channels == 12  # the upsampling read the encoder's 6 + 6 channels
    loss = nn.functional.mse_loss(grown.train()(x), x)
    loss.backward()  # the decoder's new input channels learn
    assert grown[4].weight.grad[6:].abs().sum() > 0
    decision.optimizer.zero_grad()
    with torch.no_grad():
        assert torch.equal(grown.eval()(x), before)
    perfora.save_model(tmp_path / "ae.safetensors", grown)
    loaded = perfora.load_model(_autoencoder(), tmp_path / "ae.safetensors").eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), grown(x))
