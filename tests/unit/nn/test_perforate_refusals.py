"""perforate() refuses, before the model changes, layers that growth could never extend: an
uninitialised lazy layer and a layer with integer (quantized-looking) weights; and flags that
are not True or False."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora


def _int8_linear() -> nn.Linear:
    layer = nn.Linear(4, 4)  # an integer tensor cannot require gradients
    layer.weight = nn.Parameter(layer.weight.detach().mul(10).to(torch.int8),
                                requires_grad=False)
    return layer


def _state(model: nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_an_uninitialised_lazy_layer_is_refused_with_what_to_do():
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.LazyLinear(2))
    with pytest.raises(perfora.PerforationError, match=r"'2'.*forward") as info:
        perfora.perforate(model)
    assert "exclude" in str(info.value)
    assert not perfora.dendritic_layers(model)  # nothing was wrapped
    assert type(model[0]) is nn.Linear


def test_a_lazy_layer_perforates_and_grows_after_one_forward():
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.LazyLinear(2))
    x = torch.randn(4, 3)
    model(x)  # materialises the lazy layer
    perfora.perforate(model)
    for layer in perfora.dendritic_layers(model).values():
        layer.grow(torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert model(x).shape == (4, 2)


def test_a_layer_with_integer_weights_is_refused_before_the_model_changes():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), _int8_linear())
    before = _state(model)
    with pytest.raises(perfora.PerforationError, match=r"'2'.*torch.int8.*exclude"):
        perfora.perforate(model)
    assert not perfora.dendritic_layers(model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_such_layers_are_fine_when_excluded_or_not_selected():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), _int8_linear(), nn.LazyLinear(3))
    perfora.perforate(model, exclude=["2", "3"])
    assert sorted(perfora.dendritic_layers(model)) == ["0"]
    other = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), _int8_linear(), nn.LazyLinear(3))
    perfora.perforate(other, paths=["0"])
    assert sorted(perfora.dendritic_layers(other)) == ["0"]
    perfora.dendritic_layers(other)["0"].grow(torch.Generator().manual_seed(0))


@pytest.mark.parametrize("layer", [nn.Linear(4, 3), nn.Conv2d(1, 2, 3)])
def test_a_single_layer_as_the_model_is_refused_with_what_to_do(layer):
    # perforate swaps the layers inside a model; a bare layer has nothing inside to swap
    with pytest.raises(perfora.PerforationError,
                       match=rf"single {type(layer).__name__}.*nn.Sequential\(layer\)"):
        perfora.perforate(layer)
    wrapped = perfora.perforate(nn.Sequential(layer))  # what the message says to do
    assert set(perfora.dendritic_layers(wrapped)) == {"0"}


@pytest.mark.parametrize("flag", ["group_norms", "verbose"])
def test_a_flag_that_is_not_a_bool_is_refused_before_the_model_changes(flag):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    before = _state(model)
    with pytest.raises(perfora.ConfigError, match=f"{flag} must be True or False, got 'no'"):
        perfora.perforate(model, **{flag: "no"})
    assert not perfora.dendritic_layers(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class _TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x).relu())


@pytest.mark.parametrize("selection", [{"paths": "fc1"}, {"names": "Linear", "exclude": "fc2"},
                                       {"types": nn.Linear, "exclude": "fc2"}],
                         ids=["paths", "names", "types"])
def test_one_string_or_class_alone_selects_as_a_list_of_one(selection):
    """``paths="fc1"`` used to be read letter by letter ("no module at path 'f'")."""
    model = perfora.perforate(_TwoLayers(), **selection)
    assert list(perfora.dendritic_layers(model)) == ["fc1"]


@pytest.mark.parametrize("selection, match", [
    ({"types": ["Linear"]}, r"types= takes classes such as nn.Linear, got the string 'Linear'; "
                            r"class names go in names=\['Linear'\]"),
    ({"paths": 3}, "paths= takes a string or a list of strings, got 3"),
    ({"names": [nn.Linear]}, "names= takes strings"),
    ({"exclude_types": int}, "exclude_types= takes nn.Module classes"),
])
def test_a_selector_of_the_wrong_kind_is_a_perforation_error(selection, match):
    model = _TwoLayers()
    with pytest.raises(perfora.PerforationError, match=match):
        perfora.perforate(model, **selection)
    assert not perfora.dendritic_layers(model)


def test_a_block_holding_a_batch_norm_is_refused_with_the_way_in():
    model = nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16)),
                          nn.Linear(16, 2))
    with pytest.raises(perfora.PerforationError,
                       match=r"'1'.*BatchNorm1d '1.1'.*running statistics.*groups=") as info:
        perfora.perforate(model, paths=["1"], neuron_axes={"1": -1}, num_neurons={"1": 16})
    assert "inside it" in str(info.value)
    assert not perfora.dendritic_layers(model)  # nothing was wrapped
    perfora.perforate(model, paths=["1.0"])  # the way the message names works
    assert list(perfora.dendritic_layers(model)) == ["1.0"]


def test_a_block_with_dropout_trains_after_growth_each_dendrite_its_own_mask():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5))
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), block, nn.Linear(16, 2))
    perfora.perforate(model, paths=["2"], neuron_axes={"2": -1}, num_neurons={"2": 16})
    x = torch.randn(4, 8)
    model.eval()
    before = model(x)
    layer = perfora.dendritic_layers(model)["2"]
    layer.grow(torch.Generator().manual_seed(0))
    layer.grow(torch.Generator().manual_seed(1))
    assert torch.equal(model(x), before)  # growth keeps the outputs (eval: no dropout)
    model.train()
    model(x).sum().backward()  # used to fail: vmap refused Dropout's random mask
    assert layer.bank_params is not None
    masks = layer._bank_outputs(torch.ones(64, 16))
    assert not torch.equal(masks[0] == 0, masks[1] == 0)  # not one mask for all dendrites


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 36, 8))
        self.proj = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.head(self.bn1(self.conv1(x))))


@pytest.mark.parametrize("selection, match", [
    ({"groups": [("bn1", "conv1")]}, r"'bn1' is not a selected layer \(a pair is \(layer, "
                                     r"norm\): the layer first\)"),
    ({"types": nn.Linear, "groups": [("conv1", "bn1")]}, r"'conv1' is not a selected layer; "
                                                         r"select it too"),
    ({"groups": [("conv1", "proj")]}, r"'proj' is a Linear, not a norm layer"),
    ({"neuron_axes": {"attn_out": -1}}, r"neuron_axes= names 'attn_out', which is neither"),
    ({"num_neurons": {"Conv": 4}}, r"num_neurons= names 'Conv', which is neither"),
])
def test_selectors_that_contradict_or_name_nothing_are_refused(selection, match):
    model = _Net()
    before = _state(model)
    with pytest.raises(perfora.PerforationError, match=match):
        perfora.perforate(model, **selection)
    assert not perfora.dendritic_layers(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_path_also_excluded_is_said_and_left_out():
    model = _Net()
    with pytest.warns(UserWarning, match=r"paths=\['head.1'\] is also excluded by "
                                         r"exclude=\['head'\]: exclude wins"):
        perfora.perforate(model, paths=["head.1", "proj"], exclude=["head"])
    assert list(perfora.dendritic_layers(model)) == ["proj"]


def test_consistent_selectors_still_work():
    model = perfora.perforate(_Net(), groups=[("conv1", "bn1")],
                              neuron_axes={"Conv2d": 1}, num_neurons={"proj": 2})
    assert sorted(perfora.dendritic_layers(model)) == ["conv1", "head.1", "proj"]
    assert isinstance(model.bn1, nn.Identity)  # grouped with conv1


def test_naming_the_axis_of_a_layer_not_selected_is_said():
    model = _Net()
    with pytest.warns(UserWarning, match=r"neuron_axes= names 'proj', which is not selected, "
                                         r"so it is not wrapped"):
        perfora.perforate(model, paths=["conv1"], neuron_axes={"proj": -1})
    assert list(perfora.dendritic_layers(model)) == ["conv1"]


@pytest.mark.parametrize("norm", [nn.utils.parametrizations.weight_norm, nn.utils.weight_norm,
                                  nn.utils.parametrizations.spectral_norm])
def test_a_parametrized_layer_is_left_out_and_refused_when_named(norm, caplog):
    # it was wrapped, and the first dendrite set failed with KeyError: 'weight' (wav2vec 2.0's
    # weight-normed positional conv, spectral-normed GAN discriminators)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), norm(nn.Linear(8, 8)), nn.ReLU(),
                          nn.Linear(8, 2)).eval()
    x = torch.randn(5, 4)
    with caplog.at_level("INFO", logger="perfora"):
        perfora.perforate(model)
    assert sorted(perfora.dendritic_layers(model)) == ["0", "4"]
    assert "skipped 2: its weight is computed by a parametrization" in caplog.text
    before = model(x)
    controller = perfora.GrowthController(model, seed=0, write_files=False)
    controller.set_optimizer(torch.optim.Adam, lr=1e-2)
    controller.build_optimizer()
    controller.add_dendrites()
    assert torch.equal(model(x), before)
    with pytest.raises(perfora.PerforationError, match="'0'.*parametrization.*Remove it first"):
        perfora.perforate(nn.Sequential(norm(nn.Linear(8, 8))), paths=["0"])
