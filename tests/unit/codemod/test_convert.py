"""perforate() and describe(): which modules get dendrites, and what the user gets back."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from perfora import ConversionError, DendriticLayer, dendritic_layers, describe, perforate


class Net(nn.Module):
    """Conv + BatchNorm blocks, a pooled head of Linear + LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.ReLU(),
                                  nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)).flatten(1))


ALL_NET_LAYERS = {"features.0", "features.3", "head.0", "head.3"}


def make_net(seed: int = 0) -> tuple[Net, torch.Tensor]:
    torch.manual_seed(seed)
    net = Net()
    # non-trivial BatchNorm statistics, so grouping a norm is really tested
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_()
                m.bias.normal_()
    return net, torch.randn(2, 3, 8, 8)


class Block(nn.Module):
    """A module perfora does not know how to batch: a Linear inside, features last."""

    def __init__(self, d_in: int = 4, d_out: int = 6) -> None:
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) + 0.5


class BlockNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block(4, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(x))


def wrapped_paths(model: nn.Module) -> set[str]:
    return set(dendritic_layers(model))


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def grow_all(model: nn.Module, times: int = 1, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(times):
        for layer in dendritic_layers(model).values():
            layer.grow(gen)


# --------------------------------------------------------------------------- selection
def test_default_wraps_every_linear_and_conv_and_keeps_the_output():
    net, x = make_net()
    original = copy.deepcopy(net).eval()
    assert perforate(net) is net
    assert wrapped_paths(net) == ALL_NET_LAYERS
    assert isinstance(net.features[0], DendriticLayer)
    assert isinstance(net.features[1], nn.BatchNorm2d)  # norms stay where they were
    assert n_params(net) == n_params(original)
    net.eval()
    with torch.no_grad():
        assert torch.equal(net(x), original(x))
        grow_all(net, 3)
        assert torch.equal(net(x), original(x))
    net.train()
    original.train()
    assert torch.equal(net(x), original(x))


def test_default_types_include_conv1d_and_conv3d():
    model = nn.ModuleDict({"c1": nn.Conv1d(2, 3, 3), "c3": nn.Conv3d(2, 3, 3),
                           "act": nn.ReLU(), "emb": nn.Embedding(5, 2)})
    perforate(model)
    assert wrapped_paths(model) == {"c1", "c3"}
    assert {w.path: w.type for w in describe(model).wrapped} == {"c1": "Conv1d", "c3": "Conv3d"}


def test_select_by_class_name():
    net, _ = make_net()
    perforate(net, names=["Conv2d"])
    assert wrapped_paths(net) == {"features.0", "features.3"}


def test_select_by_dotted_path_with_or_without_leading_dot():
    net, x = make_net()
    original = copy.deepcopy(net).eval()
    perforate(net, paths=["head.0", ".features.3"])
    assert wrapped_paths(net) == {"head.0", "features.3"}
    with torch.no_grad():
        assert torch.equal(net.eval()(x), original(x))


def test_select_by_predicate():
    net, _ = make_net()
    seen: list[str] = []

    def wide_linear(path: str, module: nn.Module) -> bool:
        seen.append(path)
        return isinstance(module, nn.Linear) and module.out_features == 16

    perforate(net, predicate=wide_linear)
    assert wrapped_paths(net) == {"head.0"}
    assert "features.0" in seen and "head.3" in seen


def test_explicit_types():
    net, _ = make_net()
    perforate(net, types=[nn.Linear])
    assert wrapped_paths(net) == {"head.0", "head.3"}


def test_exclude_by_path_prefix_and_type():
    net, _ = make_net()
    perforate(net, exclude=["head"])
    assert wrapped_paths(net) == {"features.0", "features.3"}

    net, _ = make_net()
    perforate(net, exclude=[".features.0", "head.3"])
    assert wrapped_paths(net) == {"features.3", "head.0"}

    net, _ = make_net()
    perforate(net, exclude_types=[nn.Conv2d])
    assert wrapped_paths(net) == {"head.0", "head.3"}

    net, _ = make_net()  # exclude wins over an explicit path
    with pytest.warns(UserWarning, match=r"exclude wins, so it is not wrapped"):
        perforate(net, paths=["head.0", "head.3"], exclude=["head.3"])
    assert wrapped_paths(net) == {"head.0"}


def test_exclude_prefix_matches_whole_path_components():
    model = nn.ModuleDict({"head": nn.Linear(3, 3), "header": nn.Linear(3, 3)})
    perforate(model, exclude=["head"])
    assert wrapped_paths(model) == {"header"}


def test_activation_is_passed_to_every_layer():
    net, _ = make_net()
    perforate(net, activation="tanh")
    assert {layer.activation for layer in dendritic_layers(net).values()} == {"tanh"}
    net, _ = make_net()
    with pytest.raises(ConversionError, match="activation"):
        perforate(net, activation="gelu")


# --------------------------------------------------------------------------- norm groups
def test_group_norms_folds_following_norms_and_keeps_the_output():
    net, x = make_net()
    original = copy.deepcopy(net).eval()
    perforate(net, group_norms=True)
    assert wrapped_paths(net) == ALL_NET_LAYERS
    for norm_path in ("features.1", "features.4", "head.1"):
        assert isinstance(net.get_submodule(norm_path), nn.Identity), norm_path
    groups = {w.path: w.grouped_with for w in describe(net).wrapped}
    assert groups == {"features.0": "features.1", "features.3": "features.4",
                      "head.0": "head.1", "head.3": None}
    layer = net.features[0]
    assert isinstance(layer.source, nn.Conv2d)
    assert isinstance(layer.base[1], nn.BatchNorm2d)
    assert n_params(net) == n_params(original)  # the norm moved, nothing was copied

    net.eval()
    with torch.no_grad():
        assert torch.equal(net(x), original(x))
        grow_all(net, 3)
        assert torch.equal(net(x), original(x))


def test_group_norms_param_count_counts_only_the_layer_per_dendrite():
    net, _ = make_net()
    perforate(net, group_norms=True)
    layer = net.features[0]
    base = n_params(layer.base)
    conv = n_params(layer.source)
    layer.grow()
    layer.grow()
    assert n_params(layer) == base + 2 * conv + 2 * 8 + 1 * 8


def test_group_norms_respects_excluded_norms():
    net, _ = make_net()
    perforate(net, group_norms=True, exclude_types=[nn.LayerNorm])
    assert isinstance(net.head[1], nn.LayerNorm)
    assert isinstance(net.features[1], nn.Identity)


def test_explicit_groups():
    net, x = make_net()
    original = copy.deepcopy(net).eval()
    perforate(net, groups=[("features.0", ".features.1")])
    assert isinstance(net.features[1], nn.Identity)
    assert isinstance(net.features[4], nn.BatchNorm2d)  # not grouped: not asked for
    assert {w.path: w.grouped_with for w in describe(net).wrapped}["features.0"] == "features.1"
    with torch.no_grad():
        assert torch.equal(net.eval()(x), original(x))


# --------------------------------------------------------------------------- generic modules
def test_generic_module_with_neuron_axis_and_num_neurons():
    torch.manual_seed(0)
    model = BlockNet()
    x = torch.randn(5, 4)
    original = copy.deepcopy(model)
    perforate(model, paths=["block"], neuron_axes={"block": -1}, num_neurons={"block": 6})
    layer = model.block
    assert isinstance(layer, DendriticLayer) and layer.kind == "generic"
    assert (layer.num_neurons, layer.neuron_axis) == (6, -1)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        assert torch.equal(model(x), original(x))
        for _ in range(3):
            layer.grow(gen)
            assert torch.equal(model(x), original(x))


def test_generic_module_neurons_from_example_input_and_axis_by_class_name():
    torch.manual_seed(0)
    model = BlockNet()
    x = torch.randn(5, 4)
    original = copy.deepcopy(model)
    perforate(model, names=["Block", "Linear"], neuron_axes={"Block": -1}, example_input=x)
    assert wrapped_paths(model) == {"block", "out"}
    assert model.block.num_neurons == 6
    with torch.no_grad():
        for _ in range(3):
            grow_all(model)
            assert torch.equal(model(x), original(x))


@pytest.mark.parametrize("extra", [
    {},
    {"num_neurons": {"block": 6}},
    {"example_input": torch.randn(2, 4)},
], ids=["nothing", "num_neurons", "example_input"])
def test_generic_module_without_neuron_axis_says_to_pass_neuron_axes(extra):
    model = BlockNet()
    with pytest.raises(ConversionError) as info:
        perforate(model, paths=["block"], **extra)
    message = str(info.value)
    assert "neuron_axes" in message and "block" in message
    assert not isinstance(model.block, DendriticLayer)


# --------------------------------------------------------------------------- report
class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.scale = nn.Parameter(torch.ones(1))
        self.frozen = nn.Parameter(torch.zeros(3), requires_grad=False)
        self.proj = nn.Linear(8, 5)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.proj(self.emb(idx)) * self.scale + self.frozen.sum()


def test_report_lists_wrapped_layers_and_parameters_left_outside(capsys):
    model = perforate(Tagger(), verbose=True)
    report = describe(model)
    assert [(w.path, w.type, w.neurons, w.neuron_axis, w.dendrites)
            for w in report.wrapped] == [("proj", "Linear", 5, -1, 0)]
    assert sorted(report.outside) == [("emb.weight", 80), ("scale", 1)]
    text = str(report)
    for word in ("proj", "Linear", "neurons=5", "emb.weight", "scale"):
        assert word in text
    assert "frozen" not in text
    assert "proj" in capsys.readouterr().out  # verbose prints the same report

    model.proj.grow()
    assert describe(model).wrapped[0].dendrites == 1


def test_report_with_nothing_left_outside():
    net, _ = make_net()
    perforate(net, group_norms=True)
    report = describe(net)
    assert report.outside == []
    assert {w.path for w in report.wrapped} == ALL_NET_LAYERS
    assert {w.neurons for w in report.wrapped if w.path.startswith("head")} == {16, 4}


# --------------------------------------------------------------------------- sharing, repeats
class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        lin = nn.Linear(4, 4)
        self.first = nn.Sequential(lin, nn.ReLU(), lin)  # same module twice in one parent
        self.second = nn.ModuleDict({"again": lin})  # and once more elsewhere

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second["again"](self.first(x))


def test_shared_modules_get_one_shared_dendritic_layer():
    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(3, 4)
    original = copy.deepcopy(model)
    perforate(model)
    layer = model.first[0]
    assert isinstance(layer, DendriticLayer)
    assert model.first[2] is layer and model.second["again"] is layer
    assert len(describe(model).wrapped) == 1
    assert n_params(model) == n_params(original)
    with torch.no_grad():
        assert torch.equal(model(x), original(x))
        layer.grow(torch.Generator().manual_seed(0))
        assert model.second["again"].num_dendrites == 1
        assert torch.equal(model(x), original(x))


def test_perforating_twice_is_a_no_op():
    net, x = make_net()
    perforate(net, group_norms=True)
    grow_all(net, 2)
    layers = dendritic_layers(net)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    net.eval()
    with torch.no_grad():
        before = net(x)
    assert perforate(net, group_norms=True) is net
    assert dendritic_layers(net) == layers  # same objects, nothing re-wrapped
    assert not any(isinstance(m.base, DendriticLayer) for m in layers.values())
    assert net.state_dict().keys() == state.keys()
    assert all(torch.equal(net.state_dict()[k], v) for k, v in state.items())
    with torch.no_grad():
        assert torch.equal(net(x), before)


def test_perforate_looks_through_dataparallel():
    net, _ = make_net()
    wrapper = nn.DataParallel(net)
    assert perforate(wrapper) is wrapper
    assert wrapped_paths(net) == ALL_NET_LAYERS


# --------------------------------------------------------------------------- errors
def test_nothing_to_wrap_raises_with_the_modules_it_saw():
    model = nn.Sequential(nn.Embedding(10, 4), nn.ReLU())
    with pytest.raises(ConversionError, match="nothing to perforate") as info:
        perforate(model)
    assert "Embedding" in str(info.value) and "ReLU" in str(info.value)

    net, _ = make_net()
    with pytest.raises(ConversionError, match="nothing to perforate"):
        perforate(net, names=["Conv5d"])
    with pytest.raises(ConversionError, match="nothing to perforate"):
        perforate(net, exclude=["features", "head"])
    assert wrapped_paths(net) == set()


def test_unknown_path_raises_and_changes_nothing():
    net, _ = make_net()
    with pytest.raises(ConversionError, match="head.9"):
        perforate(net, paths=["head.0", "head.9"])
    assert wrapped_paths(net) == set()
    with pytest.raises(ConversionError, match="features.7"):
        perforate(net, groups=[("features.0", "features.7")])
    assert wrapped_paths(net) == set()


def test_unknown_exclude_path_raises():
    """A typo in ``exclude`` must not silently wrap the layer it was meant to keep out."""
    net, _ = make_net()
    with pytest.raises(ConversionError, match="haed"):
        perforate(net, exclude=["haed"])
    assert wrapped_paths(net) == set()


def test_module_without_parameters_cannot_be_perforated():
    net, _ = make_net()
    with pytest.raises(ConversionError, match="features.2"):
        perforate(net, paths=["features.2"])


def test_non_module_raises():
    with pytest.raises(ConversionError, match="nn.Module"):
        perforate(lambda x: x)


def test_a_layer_with_zero_outputs_is_a_conversion_error_not_an_attribute_error():
    with pytest.raises(ConversionError, match="at least one neuron"):
        perforate(nn.Sequential(nn.Linear(3, 0)))
