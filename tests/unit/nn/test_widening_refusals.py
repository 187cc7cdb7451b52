"""Models a widening would silently change or break are refused before anything changes:
a Linear's last axis under a dim-1 module, blocks that only look like known ones, shared
activations, Sequential steps used elsewhere, parametrized and tied weights, bad ``pairs=``,
and a state whose wider layers this model cannot follow. Shared relu stays widenable, through
the whole controller run (the rewind at the end included)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

import perfora

X = torch.randn(7, 8, generator=torch.Generator().manual_seed(0))


def _controller(model: nn.Module, **settings) -> perfora.GrowthController:
    ctl = perfora.GrowthController(model, growth="neurons", write_files=False, **settings)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    ctl.build_optimizer()
    return ctl


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("dim1_module", [nn.Flatten(), nn.MaxPool1d(2),
                                         nn.AdaptiveAvgPool1d(1)])
def test_a_linear_before_a_module_of_dim_1_is_refused(dim1_module):
    # a Linear on [N, L, F] has its neurons on the last axis; Flatten and 1-D pooling work on
    # dim 1: widening interleaved the new features and the output changed (by up to 0.38)
    model = nn.Sequential(nn.Linear(8, 4), dim1_module, nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(5, 4, 8))
    plan = perfora.plan_widening(model)
    assert "last axis" in plan.refused["0"] and type(dim1_module).__name__ in plan.refused["0"]
    with pytest.raises(perfora.PerforationError, match="last axis"):
        perfora.widen(model, "0", 2)


def test_a_traced_flatten_after_a_linear_is_refused_and_a_conv_before_it_still_widens():
    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.proj, self.fc = nn.Conv1d(3, 4, 3), nn.Linear(6, 5), \
                nn.Linear(20, 2)

        def forward(self, x):  # [N, 3, 8] -> conv [N, 4, 6] -> per-channel proj [N, 4, 5]
            return self.fc(torch.flatten(self.proj(self.conv(x)), 1))

    plan = perfora.plan_widening(Head())
    assert "last axis" in plan.refused["proj"] and "flatten" in plan.refused["proj"]


class _NormedMLP(nn.Module):
    """Named like a ViT MLP (fc1, activation_fn, fc2) but with a LayerNorm in between."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.activation_fn = nn.Linear(8, 16), nn.GELU()
        self.layer_norm, self.fc2 = nn.LayerNorm(16), nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(self.layer_norm(self.activation_fn(self.fc1(x))))


class _LlamaLikeMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(8, 16), nn.Linear(8, 16)
        self.down_proj, self.act_fn = nn.Linear(16, 8), nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class _SparseMLP(_LlamaLikeMLP):
    """Llama's MLP plus a cut-off from the mean over the hidden width (as Gemma 3n's)."""

    def forward(self, x):
        gate = self.gate_proj(x)
        gate = torch.relu(gate - gate.mean(-1, keepdim=True))
        return self.down_proj(self.act_fn(gate) * self.up_proj(x))


class _ChunkedMLP(nn.Module):
    """ViT names, but fc1 gives twice what fc2 reads (chunked into value and gate)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.activation_fn, self.fc2 = nn.Linear(8, 32), nn.SiLU(), nn.Linear(16, 8)

    def forward(self, x):
        value, gate = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(self.activation_fn(gate) * value)


@pytest.mark.parametrize(("block", "path", "reason"), [
    (_NormedMLP, "fc1", "also holds layer_norm (LayerNorm)"),
    (_SparseMLP, "gate_proj", "gate_proj's output also goes to sub"),
    (_ChunkedMLP, "fc1", "fc1 gives 32 outputs and fc2 reads 16"),
])
def test_a_block_named_like_a_known_one_but_computing_more_is_refused(block, path, reason):
    model = block()
    plan = perfora.plan_widening(model)
    assert reason in plan.refused[path] and "pattern does not have" in plan.refused[path]
    before = _shapes(model)
    with pytest.raises(perfora.PerforationError, match="pattern does not have"):
        perfora.widen(model, path, 4)
    assert _shapes(model) == before


def test_a_block_that_computes_what_its_names_say_still_widens_exactly():
    model = _LlamaLikeMLP().eval()
    x = torch.randn(2, 3, 8)
    before = model(x)
    assert perfora.plan_widening(model).layers["gate_proj"].found_by == "Llama MLP"
    perfora.widen(model, "gate_proj", 4)
    assert model.down_proj.in_features == 20 and torch.equal(model(x), before)


class _SharedActivation(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3, self.act = nn.Linear(8, 12), nn.Linear(12, 6), \
            nn.Linear(6, 2), act

    def forward(self, x):
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


def test_a_shared_smooth_activation_is_refused_with_the_fix():
    # silu applied block by block keeps the output exact; one module shared by two widened
    # layers mixed their blocks: outputs off in the last bit, reloads unequal, the rewind broke
    plan = perfora.plan_widening(_SharedActivation(nn.SiLU()))
    for path in ("fc1", "fc2"):
        assert "act, which is called 2 times" in plan.refused[path]
        assert "give each call its own module" in plan.refused[path]
    shared = nn.GELU()
    seq = nn.Sequential(nn.Linear(8, 6), shared, nn.Linear(6, 6), shared, nn.Linear(6, 2))
    reason = perfora.plan_widening(seq, trace=False).refused["0"]
    assert "1 (GELU) is the same module as 3" in reason and "its own module" in reason


def test_a_shared_relu_widens_both_layers_reloads_equal_and_rewinds_at_the_end(tmp_path):
    torch.manual_seed(0)
    model = perfora.perforate(_SharedActivation(nn.ReLU()))
    ctl = _controller(model, max_neuron_steps=2)
    ctl.step(0.9)  # the best model: the narrow one
    for _ in range(2):
        model = ctl.add_neurons().model
    assert (model.fc1.num_neurons, model.fc2.num_neurons) == (36, 18)
    assert type(model.act) is nn.ReLU  # exact on any width: left as it is
    xs = [torch.randn(b, 8) for b in range(1, 12)]
    perfora.save_model(tmp_path / "m.pt", model)
    torch.manual_seed(0)
    fresh = perfora.load_model(perfora.perforate(_SharedActivation(nn.ReLU())), tmp_path / "m.pt")
    assert all(torch.equal(fresh(x), model(x)) for x in xs)
    for _ in range(40):  # no better score: the run completes on the best, narrow model
        decision = ctl.step(0.1)
        if decision.complete:
            break
    assert decision.complete
    assert (decision.model.fc1.num_neurons, decision.model.fc2.num_neurons) == (12, 6)


def test_a_sequential_whose_steps_the_forward_also_reads_is_refused_where_fx_sees_it():
    class Features(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 2))

        def forward(self, x):
            feats = []
            for layer in self.body:
                x = layer(x)
                feats.append(x)
            return x + feats[1].mean(-1, keepdim=True)  # the hidden layer, read again

    model = perfora.perforate(Features())
    assert "goes to mean" in perfora.plan_widening(model).refused["body.0"]
    with pytest.raises(perfora.PerforationError, match="no wrapped layer can gain neurons"):
        _controller(model)


@pytest.mark.filterwarnings("ignore:.*weight_norm. is deprecated:FutureWarning")
@pytest.mark.parametrize("wrap", [
    parametrizations.weight_norm, parametrizations.spectral_norm,
    lambda m: torch.nn.utils.weight_norm(m),  # the old, hook-based form
], ids=["weight_norm", "spectral_norm", "old_weight_norm"])
@pytest.mark.parametrize("where", [0, 2], ids=["producer", "consumer"])
def test_a_parametrized_layer_is_refused_before_anything_changes(wrap, where):
    layers = [nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 2)]
    layers[where] = wrap(layers[where])
    model = nn.Sequential(*layers)
    reason = perfora.plan_widening(model).refused["0"]
    assert f"{where}'s weight is computed by a parametrization" in reason
    before = _shapes(model)
    with pytest.raises(perfora.PerforationError, match="parametrization"):
        perfora.widen(model, "0", 2)
    assert _shapes(model) == before


def test_weights_tied_across_two_modules_are_not_untied_by_a_widening():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    model[2].weight = model[0].weight
    assert "0 shares a parameter with 2.weight (tied weights)" in \
        perfora.plan_widening(model).refused["0"]
    with pytest.raises(perfora.PerforationError, match="untie"):
        perfora.widen(model, "0", 2)
    assert model[2].weight is model[0].weight and model[0].out_features == 8


@pytest.mark.parametrize("reader", [("fc2",), ("fc2", 1.7), ("fc2", 0), ("fc2", True), 3])
def test_a_malformed_pairs_reader_is_refused_with_the_form_expected(reader):
    model = nn.Sequential()
    model.fc1, model.fc2 = nn.Linear(8, 6), nn.Linear(6, 2)
    with pytest.raises(perfora.PerforationError, match=r"is not a reader; give a module path"):
        perfora.plan_widening(model, pairs={"fc1": [reader]})


class _Untraceable(nn.Module):
    """A Sequential (followed) and a layer pair fx cannot see (a branch on a value)."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 6))
        self.fc, self.out = nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        h = self.seq(x)
        if h.sum() > 1e9:
            h = h * 0
        return self.out(torch.relu(self.fc(h)))


def test_a_state_wider_where_this_model_cannot_follow_is_refused_and_nothing_changes():
    torch.manual_seed(0)
    model = perfora.perforate(_Untraceable())
    ctl = _controller(model, neuron_pairs={"fc": ["out"]})
    state = ctl.add_neurons().model.state_dict()  # seq.0 and fc widened
    fresh = perfora.perforate(_Untraceable())
    before, shapes = fresh(X), _shapes(fresh)
    with pytest.raises(perfora.PerforationError, match="perfora.load_model"):
        fresh.load_state_dict(state)  # seq.0 widens first, then fc cannot: seq.0 undone
    assert _shapes(fresh) == shapes and torch.equal(fresh(X), before)


class _ConvBnConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.relu(self.bn(self.c1(x))))


@pytest.mark.parametrize("kind", ["sequential", "fx"])
def test_pairs_that_leave_out_a_batchnorm_on_the_way_are_refused_before_any_change(kind):
    # the BatchNorm kept its 8 channels and the next forward failed (running_mean should
    # contain 10 elements not 8)
    torch.manual_seed(0)
    if kind == "sequential":
        model = perfora.perforate(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8),
                                                nn.ReLU(), nn.Conv2d(8, 4, 3))).eval()
        producer, bn, reader = "0", "1", "3"
    else:
        model = perfora.perforate(_ConvBnConv()).eval()
        producer, bn, reader = "c1", "bn", "c2"
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        before = model(x)
    refused = rf"pairs\['{producer}'\] leaves out {bn}, which the model's own search finds"
    with pytest.raises(perfora.PerforationError, match=refused):
        perfora.widen(model, producer, 2, pairs={producer: [reader]})
    assert model.get_submodule(producer).num_neurons == 8  # nothing changed
    perfora.widen(model, producer, 2, pairs={producer: [bn, reader]})
    with torch.no_grad():
        assert torch.equal(model(x), before)


def test_pairs_for_one_half_of_a_gated_block_are_refused_before_any_change():
    # gate_proj alone gained units that its partner up_proj did not: the product failed
    model = _LlamaLikeMLP()
    with pytest.raises(perfora.PerforationError, match=r"gate_proj widens together with "
                                                       r"up_proj \(Llama MLP"):
        perfora.widen(model, "gate_proj", 2, pairs={"gate_proj": ["down_proj"]})
    assert model.gate_proj.out_features == 16 and model.down_proj.in_features == 16


def test_widen_takes_a_sequential_index_and_refuses_other_layer_values():
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    before = model(X)
    perfora.widen(model, 0, 3)  # the index of an nn.Sequential step is its path
    assert model[0].out_features == 7 and torch.equal(model(X), before)
    with pytest.raises(perfora.PerforationError, match=r"widen\(\) takes a layer's path "
                                                       r"\(e.g. 'encoder.0'\).*got 1.5"):
        perfora.widen(model, 1.5, 3)
    assert model[0].out_features == 7
