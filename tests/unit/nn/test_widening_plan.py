"""What can gain neurons and why not (the plan), ``pairs=`` and torch.fx for other models,
GradMax's directions, and widened models through checkpoints and adapters (export: in
test_export.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import perfora


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.norm = nn.Linear(6, 6), nn.Linear(6, 6), nn.LayerNorm(6)
        self.fc3, self.head = nn.Linear(6, 10), nn.Linear(10, 2)

    def forward(self, x):
        h = x + self.fc1(x)  # residual: fc1 refused
        h = self.norm(self.fc2(h))  # normalised jointly: fc2 refused
        return self.head(F.relu(self.fc3(h)))  # followed by fx: fc3 -> head


def test_the_plan_refuses_residual_and_jointly_normalised_layers_with_reasons():
    plan = perfora.plan_widening(_Residual())
    assert plan.widenable == ["fc3"]
    assert plan.layers["fc3"].consumers == [("head", 1)]
    assert plan.layers["fc3"].found_by == "torch.fx"
    assert "residual" in plan.refused["fc1"]
    assert "normalised jointly" in plan.refused["fc2"] and "LayerNorm" in plan.refused["fc2"]
    assert "output of the model" in plan.refused["head"]
    text = str(plan)
    assert "fc3 -> head" in text and "fc1: refused" in text


def test_a_sequential_chain_refuses_layernorm_and_an_unknown_module():
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 4), nn.Softmax(-1),
                          nn.Linear(4, 2))
    plan = perfora.plan_widening(model, trace=False)
    assert "normalised jointly" in plan.refused["0"]
    assert "Softmax" in plan.refused["2"] and "pairs=" in plan.refused["2"]
    assert "leaves the nn.Sequential" in plan.refused["4"]


def test_widening_a_refused_layer_raises_before_changing_anything():
    model = _Residual()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(perfora.PerforationError, match="residual"):
        perfora.widen(model, "fc1", 2)
    with pytest.raises(perfora.PerforationError, match=r"init must have shape \(2, 6\)"):
        perfora.widen(model, "fc3", 2, init=torch.zeros(3, 6))
    with pytest.raises(perfora.PerforationError, match="not a Linear, Conv"):
        perfora.widen(model, "norm", 2)
    for k in (2.5, True, "3", torch.tensor(2.0)):  # int() would round or parse these
        with pytest.raises(perfora.PerforationError, match="whole number of neurons"):
            perfora.widen(model, "fc3", k)
    with pytest.raises(perfora.PerforationError, match="takes an nn.Module, got dict"):
        perfora.plan_widening({"fc3": model.fc3})
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


class _Custom(nn.Module):
    """A model fx cannot trace (data-dependent control flow), with a custom consumer."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Conv2d(2, 5, 3)
        self.norm = nn.BatchNorm2d(5)
        self.act = nn.Tanh()
        self.out = nn.Linear(5 * 4 * 4, 3)

    def forward(self, x):
        h = self.act(self.norm(self.enc(x)))
        if h.sum() > 1e9:  # fx cannot trace this
            h = h * 2
        return self.out(h.flatten(1))


def test_pairs_widens_a_custom_module_through_batchnorm_and_flatten():
    torch.manual_seed(0)
    model = _Custom().eval()
    assert "torch.fx cannot trace" in perfora.plan_widening(model).refused["enc"]
    pairs = {"enc": ["norm", "act", ("out", 16)]}
    x = torch.randn(3, 2, 6, 6)
    want = model(x)
    entry = perfora.widen(model, "enc", 2, pairs=pairs)
    assert entry.consumers == [("out", 16)] and entry.found_by == "pairs"
    assert model.out.in_features == 7 * 16 and model.norm.num_features == 7
    assert torch.equal(model(x), want)
    with pytest.raises(perfora.PerforationError, match="not a submodule"):
        perfora.plan_widening(model, pairs={"enc": ["nope"]})
    bad = perfora.plan_widening(model, pairs={"enc": ["out"]})  # forgot the flatten repeat
    assert "reads 112 inputs" in bad.refused["enc"]
    # a BatchNorm of another width named as a reader is refused, not widened out of step
    wrong = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(5), nn.Linear(8, 2))
    plan = perfora.plan_widening(wrong, pairs={"0": ["1", "2"]})
    assert "'1' normalises 5 channels, not the 8 '0' gives" in plan.refused["0"]
    with pytest.raises(perfora.PerforationError, match="normalises 5 channels"):
        perfora.widen(wrong, "0", 2, pairs={"0": ["1", "2"]})
    assert wrong[1].num_features == 5 and wrong[0].out_features == 8  # nothing changed


def test_gradmax_directions_give_the_new_outgoing_weights_a_larger_gradient():
    torch.manual_seed(0)
    n, d_in, d_out, k = 256, 12, 5, 3
    x = torch.randn(n, d_in) @ torch.randn(d_in, d_in)  # correlated inputs
    g_y = x @ torch.randn(d_in, d_out) + 0.1 * torch.randn(n, d_out)  # error tied to x

    def outgoing_grad_norm(w_new):  # |dL/dW2_new| = |E[g_y (W_new x)^T]| for linear units
        return (g_y.T @ (x @ w_new.T) / n).norm()

    chosen = perfora.gradmax_init(x, g_y, k, scale=0.5)
    assert chosen.shape == (k, d_in)
    assert torch.allclose(chosen.norm(dim=1), torch.full((k,), 0.5))
    best_random = max(outgoing_grad_norm(0.5 * F.normalize(torch.randn(k, d_in), dim=1))
                      for _ in range(200))
    assert outgoing_grad_norm(chosen) > best_random
    more = perfora.gradmax_init(x, g_y, d_out + 2, scale=1.0)  # beyond M's rank
    assert torch.allclose(more @ more.T, torch.eye(d_out + 2, dtype=more.dtype), atol=1e-5)


def test_widen_takes_gradmax_rows_as_the_new_incoming_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    rows = perfora.gradmax_init(torch.randn(32, 4), torch.randn(32, 2), 2, scale=0.3)
    perfora.widen(model, "0", 2, init=rows)
    assert torch.equal(model[0].weight[6:], rows)
    assert torch.equal(model[0].bias[6:], torch.zeros(2))


def _perforated():
    torch.manual_seed(0)
    return perfora.perforate(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                                           nn.Flatten(), nn.Linear(4 * 4 * 4, 5), nn.GELU(),
                                           nn.Linear(5, 2)))


def test_a_widened_grown_model_saves_and_loads_into_a_fresh_narrow_model(tmp_path):
    model = _perforated()
    g = torch.Generator().manual_seed(0)
    for layer in perfora.dendritic_layers(model).values():
        layer.grow(g)
    perfora.widen(model, "0", 2)
    perfora.widen(model, "4", 3)
    for layer in perfora.dendritic_layers(model).values():
        layer.grow(g)
    model.eval()
    x = torch.randn(2, 3, 6, 6)
    perfora.save_model(tmp_path / "m.safetensors", model)
    fresh = torch.nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                                nn.Linear(4 * 4 * 4, 5), nn.GELU(), nn.Linear(5, 2))
    loaded = perfora.load_model(fresh, tmp_path / "m.safetensors").eval()
    assert torch.equal(loaded(x), model(x))
    assert loaded[0].num_neurons == 6 and loaded[4].base.in_features == 6 * 16
    spec = perfora.nn.perforation.layer_specs(loaded)["0"]
    assert spec["widened"] == [{"k": 2, "consumers": [["4", 16]], "through": [["1", 1], ["2", -3]],
                                "partners": []}]
    assert spec["base_blocks"] == {"out": [4, 2], "in": [3]}


def test_an_old_spec_without_widenings_still_loads(tmp_path):
    model = _perforated()
    perfora.save_model(tmp_path / "m.safetensors", model)
    assert "widened" not in perfora.nn.perforation.layer_specs(model)["0"]
    perfora.load_model(_perforated(), tmp_path / "m.safetensors")


def test_adapters_refuse_a_widened_base(tmp_path):
    model = _perforated()
    perfora.dendritic_layers(model)["4"].grow()
    perfora.save_dendrites(model, tmp_path / "narrow.safetensors")
    perfora.widen(model, "4", 2)
    with pytest.raises(perfora.CheckpointError, match="gained neurons"):
        perfora.save_dendrites(model, tmp_path / "wide.safetensors")
    with pytest.raises(perfora.CheckpointError, match="gained neurons"):
        perfora.load_dendrites(model, tmp_path / "narrow.safetensors")


class _BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock layout: one relu module, called twice."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + x)


class _TinyResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = _BasicBlock(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.block(torch.relu(self.stem(x))).mean((2, 3)))


def test_a_resnet_block_whose_relu_is_called_twice_widens_exactly_twice():
    # the widened relu splits its input into blocks; its second call (after the residual add,
    # 8 channels) once failed on that split, so the first widening broke the model
    torch.manual_seed(0)
    model = perfora.perforate(_TinyResNet()).eval()
    x = torch.randn(2, 3, 8, 8)
    want = model(x)
    for width in (12, 16):  # the second plan traces the widened model (blocked BatchNorm)
        perfora.widen(model, "block.conv1", 4)
        assert model.block.conv1.num_neurons == model.block.bn1.num_features == width
        assert torch.equal(model(x), want)
    model.train()
    model(x).sum().backward()
    assert model.block.conv1.source.weight.grad[8:].abs().sum() == 0  # zero outgoing weights
    assert model.block.conv2.source.weight.grad[:, 8:].abs().sum() > 0  # ... which learn


def test_a_module_called_twice_or_reachable_twice_is_not_widened():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.fc, self.out = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.fc(torch.relu(self.inp(x))))
            return self.out(torch.relu(self.fc(h)))  # fc again: its weights are shared

    plan = perfora.plan_widening(perfora.perforate(Twice()))
    assert "fc, which is called 2 times" in plan.refused["inp"]
    assert "it is called 2 times" in plan.refused["fc"]
    shared = nn.Linear(8, 8)
    seq = perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), shared, nn.ReLU(), shared,
                                          nn.ReLU(), nn.Linear(8, 2)))
    plan = perfora.plan_widening(seq)  # the graph sees both calls of the shared layer
    assert "goes to 2, which is called 2 times" in plan.refused["0"]
    with pytest.raises(perfora.PerforationError, match="called 2 times"):
        perfora.widen(seq, "0", 2)
    plan = perfora.plan_widening(seq, trace=False)  # without fx: the two paths of one module
    assert "2 is the same module as 4 (used twice)" in plan.refused["0"]


class _Bottleneck(nn.Module):
    """torchvision's Bottleneck layout: one relu called three times, a downsample branch."""

    def __init__(self, cin: int, width: int, cout: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False),
                                        nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


def test_bottleneck_blocks_widen_their_inner_convolutions_exactly_twice():
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(_Bottleneck(4, 6, 8), _Bottleneck(8, 6, 8))).eval()
    x = torch.randn(2, 4, 5, 5)
    want = model(x)
    plan = perfora.plan_widening(model)
    inner = ["0.conv1", "0.conv2", "1.conv1", "1.conv2"]
    assert sorted(path for path, e in plan.layers.items() if e.widenable) == inner
    assert "residual connection" in plan.refused["0.conv3"]
    for _ in range(2):
        for path in inner:
            perfora.widen(model, path, 3)
            assert torch.equal(model(x), want), path
    assert model[1].conv2.num_neurons == 12 and model[1].conv3.source.in_channels == 12


class FeaturesThenClassifier(nn.Module):
    """The VGG/AlexNet split: the last conv of ``features`` is read by ``classifier``'s first
    Linear, in another nn.Sequential."""

    def __init__(self, traceable: bool = True) -> None:
        super().__init__()
        self.traceable = traceable
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                      nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, 16), nn.ReLU(),
                                        nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        if not self.traceable and h.sum() > 1e9:  # a branch on a value: fx cannot follow
            h = h * 2
        return self.classifier(h)


def test_a_chain_that_leaves_its_sequential_is_followed_by_the_graph():
    torch.manual_seed(0)
    model = perfora.perforate(FeaturesThenClassifier()).eval()
    plan = perfora.plan_widening(model)
    assert plan.layers["features.0"].consumers == [("classifier.1", 16)]
    assert plan.layers["features.0"].found_by == "torch.fx"
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        before = model(x)
    perfora.widen(model, "features.0", 3)
    with torch.no_grad():
        assert torch.equal(model(x), before)
    assert model.features[1].num_features == 11
    assert model.classifier[1].source.weight.shape == (16, 11 * 16)


def test_where_the_model_does_not_trace_the_chain_refusal_says_so():
    plan = perfora.plan_widening(perfora.perforate(FeaturesThenClassifier(traceable=False)))
    assert not plan.layers["features.0"].widenable
    assert "leaves the nn.Sequential features" in plan.refused["features.0"]
    assert "does not trace with torch.fx" in plan.refused["features.0"]


class _AlexNetLayout(nn.Module):
    """AlexNet's and EfficientNet's head: pool, torch.flatten, then Dropout before the Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(2))
        self.avgpool = nn.AdaptiveAvgPool2d((2, 2))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Linear(8 * 4, 16), nn.ReLU(),
                                        nn.Dropout(0.5), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


@pytest.mark.parametrize("kind", ["sequential", "fx"])
def test_a_dropout_after_the_flatten_stays_as_it_is_and_the_widening_is_exact(kind):
    # it was wrapped to split the channel axis of a tensor the flatten had made 2-D: the
    # widened model failed at its next forward (IndexError: tuple index out of range)
    torch.manual_seed(0)
    if kind == "sequential":
        model = perfora.perforate(nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.SiLU(), nn.Flatten(), nn.Dropout(0.2),
            nn.Linear(8 * 36, 4)))
        producer = "0"
    else:
        model, producer = perfora.perforate(_AlexNetLayout()), "features.0"
    model.eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        before = model(x)
    perfora.widen(model, producer, 3)
    with torch.no_grad():
        assert torch.equal(model(x), before)
    model.train()
    model(x).square().mean().backward()  # the widened model trains, dropout and all
    assert model.get_submodule(producer).source.weight.grad.shape[0] == 11


def test_a_module_after_the_flatten_that_would_need_splitting_is_refused():
    model = perfora.perforate(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(),
                                            nn.SiLU(), nn.Linear(8 * 36, 4)))
    assert perfora.plan_widening(model).refused["0"] == (
        "its output is flattened and then goes through 3 (SiLU), which a widening splits by "
        "neuron only before a flatten")


_HEAD_READS = {
    "torch.flatten": lambda h: torch.flatten(h, 1),
    "h.flatten(1)": lambda h: h.flatten(1),
    "h.flatten(start_dim=1)": lambda h: h.flatten(start_dim=1),
    "h.view(h.size(0), -1)": lambda h: h.view(h.size(0), -1),
    "h.reshape(h.shape[0], -1)": lambda h: h.reshape(h.shape[0], -1),
    "h.view(h.size()[0], -1)": lambda h: h.view(h.size()[0], -1),
    "torch.reshape(h, (h.shape[0], -1))": lambda h: torch.reshape(h, (h.shape[0], -1)),
}


class _CnnHead(nn.Module):
    """A CNN whose head reads the last conv through one of the usual flattening idioms."""

    def __init__(self, read) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 6, 3, padding=1)
        self.head, self.read = nn.Linear(6 * 4, 3), read

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.head(self.read(h))


@pytest.mark.parametrize("idiom", list(_HEAD_READS))
def test_every_usual_flattening_idiom_before_the_head_lets_the_last_conv_widen(idiom):
    # x.flatten(1), x.view(x.size(0), -1) and reshape were refused ("flatten (call_method),
    # which a widening cannot follow"): growth="auto" silently left the last conv alone
    torch.manual_seed(0)
    model = perfora.perforate(_CnnHead(_HEAD_READS[idiom])).eval()
    plan = perfora.plan_widening(model)
    assert plan.layers["conv2"].consumers == [("head", 4)], plan.refused.get("conv2")
    x = torch.randn(2, 1, 4, 4)
    with torch.no_grad():
        before = model(x)
    perfora.widen(model, "conv2", 2)
    with torch.no_grad():
        assert torch.allclose(model(x), before, atol=1e-6)
    assert model.head.source.in_features == 8 * 4


@pytest.mark.parametrize("read", [lambda h: h.view(-1, 24), lambda h: h.reshape(2, 12, 2),
                                  lambda h: h.flatten()])
def test_a_reshape_to_a_fixed_width_or_over_the_batch_is_still_refused(read):
    plan = perfora.plan_widening(_CnnHead(read))
    assert "conv2" in plan.refused and "cannot follow" in plan.refused["conv2"]


def test_a_refusal_at_a_function_says_what_to_write_instead():
    plan = perfora.plan_widening(_CnnHead(lambda h: h.view(-1, 24)))
    assert "a shape with a fixed width would not fit" in plan.refused["conv2"]
    assert "x.view(x.size(0), -1)" in plan.refused["conv2"]

    class _Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 2)
            self.fc3, self.fc4 = nn.Linear(2, 5), nn.Linear(5, 2)

        def forward(self, x):
            h = self.fc2(F.dropout(F.gelu(self.fc1(x)), 0.1, self.training))
            return self.fc4(F.dropout(F.relu(self.fc3(h)), 0.1, self.training))

    plan = perfora.plan_widening(_Functional())
    assert "use the module form, nn.GELU()" in plan.refused["fc1"]
    assert plan.layers["fc3"].consumers == [("fc4", 1)]  # F.dropout is followed
