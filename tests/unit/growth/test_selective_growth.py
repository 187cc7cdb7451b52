"""Selective growth and error-driven dendrite init: partial dendrite sets, the error-signal
probe, candidate training, and the controller that plans growth from them."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import perfora
from perfora import ConfigError, ConversionError, DendriticLayer, GrowthController, PerforaConfig
from perfora.growth.candidates import plan_growth
from perfora.growth.signal import ErrorSignalProbe, input_rows
from perfora.nn.layers import dendritic_layers
from perfora.nn.perforation import layer_specs, rebuild_structure

ACT = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": F.relu}
CASES = {
    "linear": (lambda: nn.Linear(7, 6), (5, 7), -1),
    "linear_3d": (lambda: nn.Linear(7, 6), (2, 3, 7), -1),
    "linear_no_bias": (lambda: nn.Linear(7, 6, bias=False), (5, 7), -1),
    "conv1d": (lambda: nn.Conv1d(3, 6, 3, padding=1), (2, 3, 9), 1),
    "conv2d": (lambda: nn.Conv2d(3, 6, 3, padding=1, stride=2), (2, 3, 7, 7), 1),
}
SETS = [[1, 3], None, [0, 3, 5]]  # partial, full, partial


def make(case: str, activation: str = "sigmoid"):
    factory, shape, axis = CASES[case]
    torch.manual_seed(0)
    layer = DendriticLayer(factory(), num_neurons=6, neuron_axis=axis, activation=activation)
    return layer, torch.randn(shape)


def grow_sets(layer: DendriticLayer, x: torch.Tensor) -> None:
    """Grow SETS one by one, checking each addition leaves the output bit-identical."""
    for k, neurons in enumerate(SETS):
        before = layer(x)
        layer.grow(torch.Generator().manual_seed(k), neurons=neurons)
        assert torch.equal(layer(x), before), f"set {k} changed the output"
        with torch.no_grad():  # make every set live, with cascade weights
            layer.out_weight.copy_(torch.randn(layer.out_weight.shape))
            if layer.cascade is not None:
                layer.cascade.copy_(torch.randn(layer.cascade.shape))


def reference(layer: DendriticLayer, x: torch.Tensor) -> torch.Tensor:
    """Dense formula: set k's dendrite exists on its neurons only (zero output elsewhere)."""
    src, axis, n = layer.source, layer.neuron_axis, layer.num_neurons
    y = layer.base(x)
    shape = [1] * y.ndim
    shape[axis % y.ndim] = n
    fed = layer.set_neurons() or [list(range(n))] * layer.num_dendrites
    rows = 0
    ds: list[torch.Tensor] = []
    for k, neurons in enumerate(fed):
        m = len(neurons)
        w = torch.zeros_like(src.weight)
        w[neurons] = layer.bank_weight[rows:rows + m]
        b = None
        if src.bias is not None:
            b = torch.zeros_like(src.bias)
            b[neurons] = layer.bank_bias[rows:rows + m]
        rows += m
        a = F.linear(x, w, b) if layer.kind == "linear" else src._conv_forward(x, w, b)
        for j in range(k):
            a = a + layer.cascade[k * (k - 1) // 2 + j].view(shape) * ds[j]
        mask = torch.zeros(n)
        mask[neurons] = 1
        ds.append(ACT[layer.activation](a) * mask.view(shape))
        y = y + layer.out_weight[k].view(shape) * ds[k]
    return y


@pytest.mark.parametrize("case", list(CASES))
def test_partial_sets_grow_exactly_and_match_the_dense_formula(case):
    layer, x = make(case, activation="tanh")
    grow_sets(layer, x)
    assert layer.set_neurons() == [[1, 3], list(range(6)), [0, 3, 5]]
    torch.testing.assert_close(layer(x), reference(layer, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["linear", "conv2d"])
def test_partial_sets_hold_bank_rows_only_for_fed_neurons(case):
    layer, x = make(case)
    grow_sets(layer, x)
    per_row = layer.source.weight[0].numel() + (layer.source.bias is not None)
    base = sum(p.numel() for p in layer.base.parameters())
    rows = 2 + 6 + 3
    dense_mix = 3 * 6 + 3 * 6  # v (sets x neurons) and the cascade (3 pairs x neurons)
    assert sum(p.numel() for p in layer.parameters()) == base + rows * per_row + dense_mix


@pytest.mark.parametrize("case", ["linear", "conv1d"])
def test_every_parameter_gets_a_gradient_with_partial_sets(case):
    layer, x = make(case)
    grow_sets(layer, x)
    layer(x).square().sum().backward()
    assert all(p.grad is not None for p in layer.parameters())
    assert layer.bank_weight.grad.abs().sum() > 0


@pytest.mark.parametrize("case", ["linear", "conv2d"])
def test_partial_sets_train_under_bf16_autocast_like_full_sets(case):
    # bf16-mixed training: the bf16 layer output meets float32 v rows; the partial mix
    # promotes like the full-set mix (out + v * d) instead of refusing mixed dtypes, and the
    # layer's output keeps the base's dtype, as an ungrown layer's does under autocast
    layer, x = make(case)
    grow_sets(layer, x)
    with torch.no_grad():
        layer.out_weight.normal_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    out.sum().backward()
    assert layer.out_weight.grad is not None and layer.out_weight.grad.abs().sum() > 0
    assert torch.allclose(out.float(), layer(x), atol=0.1, rtol=0.05)  # bf16 rounding only


@pytest.mark.parametrize("case", ["linear", "conv2d"])
def test_a_state_dict_alone_rebuilds_partial_sets(case):
    layer, x = make(case)
    grow_sets(layer, x)
    fresh = DendriticLayer(copy.deepcopy(CASES[case][0]()), num_neurons=6,
                           neuron_axis=layer.neuron_axis)
    fresh.load_state_dict(layer.state_dict())
    assert fresh.set_neurons() == layer.set_neurons()
    assert torch.equal(fresh(x), layer(x))


def test_structure_round_trips_through_rebuild_structure():
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)))
    layer = dendritic_layers(model)["0"]
    layer.grow(torch.Generator().manual_seed(0), neurons=[2, 4])
    specs = layer_specs(model)
    assert specs["0"]["neurons"] == [[2, 4]] and "neurons" not in specs["2"]
    other = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    rebuild_structure(other, specs)
    other.load_state_dict(model.state_dict())
    x = torch.randn(5, 4)
    assert torch.equal(other(x), model(x))


def test_partial_sets_are_refused_where_they_cannot_exist():
    grouped = DendriticLayer(nn.Conv2d(4, 6, 3, groups=2), num_neurons=6, neuron_axis=1)
    with pytest.raises(ConversionError, match="cannot hold"):
        grouped.grow(neurons=[0, 1])
    layer, _ = make("linear")
    for bad in ([], [0, 0], [6], [-1]):
        with pytest.raises(ConversionError, match="neuron indices"):
            layer.resize(1, [bad])
    layer.grow(neurons=[1, 2])
    with pytest.raises(ConversionError, match="selective growth"):
        layer.split_candidate()
    with pytest.raises(ConversionError, match="shape"):
        layer.grow(neurons=[0, 1], weights={"weight": torch.zeros(3, 7)})


# ------------------------------------------------------------------------ the error signal
@pytest.mark.parametrize("case", ["linear_3d", "conv1d", "conv2d"])
def test_probe_rows_are_patches_and_output_gradients(case):
    layer, x = make(case)
    probe = ErrorSignalProbe(max_rows=10_000)
    probe.arm({"layer": layer})
    target = torch.randn_like(layer(x))
    y = layer(x)
    (y * target).sum().backward()  # dL/dy = target
    rows, errors = probe.samples("layer")
    w = layer.source.weight.reshape(6, -1)
    pre = layer.base(x) - (0 if layer.source.bias is None else
                           layer.source.bias.view([-1 if i == layer.neuron_axis % y.ndim
                                                   else 1 for i in range(y.ndim)]))
    axis = layer.neuron_axis % y.ndim
    torch.testing.assert_close(rows @ w.T, pre.movedim(axis, -1).reshape(-1, 6),
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(errors, target.movedim(axis, -1).reshape(-1, 6))
    probe.disarm()
    layer.eval()
    layer(x)
    assert probe.row_count("layer") == rows.shape[0]  # nothing recorded once disarmed


def test_probe_keeps_the_newest_rows_and_skips_eval():
    layer, _ = make("linear")
    probe = ErrorSignalProbe(max_rows=64)
    probe.arm({"l": layer})
    for i in range(20):
        layer(torch.full((16, 7), float(i))).sum().backward()
    rows, _ = probe.samples("l")
    assert rows.shape[0] == 64 and rows[-1, 0] == 19
    with torch.no_grad():
        layer(torch.zeros(4, 7))
    assert probe.row_count("l") == 64
    assert input_rows(DendriticLayer(nn.Conv2d(4, 6, 3, groups=2), num_neurons=6,
                                     neuron_axis=1), torch.zeros(1, 4, 5, 5)) is None


def test_probe_skips_transformed_and_batched_passes_and_keeps_working():
    """Tensors wrapped by a torch.func transform, or batched gradients, must not be kept:
    they would escape the transform and break the next read (an internal assert in cat)."""
    from torch.func import functional_call, grad, vmap

    layer, _ = make("linear")
    probe = ErrorSignalProbe(max_rows=64)
    probe.arm({"l": layer})
    x = torch.randn(4, 7)
    params = {n: p.detach() for n, p in layer.named_parameters()}

    def loss(p, xb):
        return functional_call(layer, p, (xb,)).square().sum()

    grad(loss)(params, x)
    vmap(grad(loss), in_dims=(None, 0))(params, x[:, None])
    x.requires_grad_()
    out = layer(x)
    torch.autograd.grad(out, x, torch.ones(3, *out.shape), is_grads_batched=True)
    assert probe.row_count("l") == 0
    layer(x).sum().backward()
    rows, errors = probe.samples("l")
    assert rows.shape == (4, 7) and torch.equal(rows, x.detach())
    assert torch.equal(errors, torch.ones(4, errors.shape[1]))


def test_candidate_training_finds_the_direction_of_the_error():
    torch.manual_seed(0)
    layer = DendriticLayer(nn.Linear(10, 4), num_neurons=4, neuron_axis=-1)
    x = torch.randn(1024, 10)
    u = torch.randn(10)
    e = torch.zeros(1024, 4)
    e[:, 1] = torch.sigmoid(3 * x @ u) - 0.5  # only neuron 1 has error a dendrite explains
    e[:, 3] = 0.01 * torch.randn(1024)  # small noise
    random = plan_growth(layer, x, e, generator=torch.Generator().manual_seed(0), steps=0)
    trained = plan_growth(layer, x, e, generator=torch.Generator().manual_seed(0), steps=100)
    assert trained.neuron_scores[1] > random.neuron_scores[1]
    d = torch.sigmoid(x @ trained.weights["weight"][1] + trained.weights["bias"][1])
    assert torch.corrcoef(torch.stack([d, e[:, 1]]))[0, 1].abs() > 0.95
    half = plan_growth(layer, x, e, generator=torch.Generator().manual_seed(0), fraction=0.5)
    assert half.neurons == [1, 3]
    assert half.weights["weight"].shape == (2, 10)


# ------------------------------------------------------------------------- the controller
def train_epoch(model: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator) -> None:
    for _ in range(4):
        x = torch.randn(32, 5, generator=gen)
        y = (x[:, 0] * x[:, 1] > 0).long()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def run(steps: int, run_dir=None, resume: bool = False, **settings):
    """A tiny run whose score never improves: growth steps at epochs 3, 6 and 9."""
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)))
    settings.setdefault("growth", "dendrites")
    ctl = GrowthController(model, n_epochs_to_switch=2, max_dendrites=3, seed=1,
                           run_dir=run_dir, **settings)  # default: failed sets are kept
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(0)
    if resume:
        opt = ctl.load("latest").optimizer
        gen.manual_seed(ctl.epoch)
    probe_x = torch.randn(6, 5, generator=torch.Generator().manual_seed(9))
    while ctl.epoch < steps:
        train_epoch(model, opt, gen)
        before = model(probe_x)
        decision = ctl.step(0.5)
        gen.manual_seed(ctl.epoch)
        if decision.restructured:
            assert torch.equal(model(probe_x), before), "growth changed the output"
            opt = decision.optimizer
        if decision.complete:
            break
    return model, ctl


def test_selective_error_growth_feeds_the_top_neurons_only():
    model, ctl = run(6, grow_fraction=0.5, dendrite_init="error")
    assert ctl.num_dendrites == 2
    for layer in dendritic_layers(model).values():
        fed = layer.set_neurons()
        assert [len(f) for f in fed] == [layer.num_neurons // 2] * 2
    # the reason says where each set went
    assert [w.fed for w in perfora.describe(model).wrapped] == [[4, 4], [1, 1]]
    assert "dendrites=2 (sets feed 4, 4 of 8 neurons)" in str(perfora.describe(model))
    reasons = [row["reason"] for row in ctl.state.history if row.get("grown")]
    assert reasons == [f"plateau: added dendrite set {n} (0: 4 of 8 neurons, 2: 1 of 2 neurons)"
                       for n in (1, 2)]
    plain, plain_ctl = run(6)
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in plain.parameters())
    assert [row["reason"] for row in plain_ctl.state.history if row.get("grown")][0] == \
        "plateau: added dendrite set 1"  # full sets: every neuron of every layer
    assert [w.fed for w in perfora.describe(plain).wrapped] == [None, None]


def test_error_init_grows_trained_candidates_not_random_ones():
    model, _ = run(3, dendrite_init="error")
    random, _ = run(3, dendrite_init="default")
    first = dendritic_layers(model)["0"]
    assert first.set_neurons() is None
    assert not torch.equal(first.bank_weight, dendritic_layers(random)["0"].bank_weight)


def test_resume_carries_partial_sets_and_ends_equal(tmp_path):
    settings = {"grow_fraction": 0.5, "dendrite_init": "error", "checkpoint_time_budget": None}
    full, _ = run(9, run_dir=tmp_path / "a", **settings)
    run(8, run_dir=tmp_path / "b", **settings)  # stopped before the epoch that records
    resumed, ctl = run(9, run_dir=tmp_path / "b", resume=True, **settings)
    assert ctl.num_dendrites == 3
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("settings, match", [
    ({"grow_fraction": 0.0}, "grow_fraction"),
    ({"grow_fraction": 1.5}, "grow_fraction"),
    ({"candidate_pool": 0}, "candidate_pool"),
    ({"candidate_lr": -1.0}, "candidate_lr"),
    ({"grow_fraction": 0.5, "rule": "correlation"}, "selective growth"),
    ({"target_score": float("nan")}, "target_score"),
    ({"target_score": "1.0"}, "target_score"),
])
def test_bad_growth_settings_raise_config_error(settings, match):
    with pytest.raises(ConfigError, match=match):
        PerforaConfig(**settings)


def test_defaults_retain_sets_and_grow_from_the_error_signal():
    cfg = PerforaConfig()
    assert (cfg.growth, cfg.dendrite_init, cfg.retain_all_dendrites, cfg.grow_fraction) == \
        ("auto", "error", True, 1.0)
    # growth='dendrites': a failed set (no improvement) is kept and the next one grows on it
    _, ctl = run(6)
    assert ctl.num_dendrites == 2 and ctl.state.switch_epochs == [3, 6]
    # the default (auto): a failed set is undone and neurons are grown instead
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)))
    ctl = GrowthController(model, n_epochs_to_switch=2, write_files=False)
    reasons = [ctl.step(0.5).reason for _ in range(6)]
    assert [r for r in reasons if r != "training"] == [
        "plateau: added dendrite set 1",
        "dendrite set 1 did not beat the best score: undone; added neuron step 1 instead "
        "(0: +8 random)"]
    assert ctl.num_dendrites == 0 and perfora.unwrap_model(ctl.model)[0].num_neurons == 16


def test_activation_setting_reaches_the_layers():
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)))
    GrowthController(model, activation="relu", write_files=False)
    assert {layer.activation for layer in dendritic_layers(model).values()} == {"relu"}
    kept = perfora.perforate(nn.Sequential(nn.Linear(4, 6)), activation="tanh")
    GrowthController(kept, write_files=False)  # unset: the perforate() choice stays
    assert dendritic_layers(kept)["0"].activation == "tanh"
    dendritic_layers(kept)["0"].grow()
    with pytest.raises(ConversionError, match="already holds tanh"):
        GrowthController(kept, activation="sigmoid", write_files=False)


@pytest.mark.parametrize("maximize, scores, target", [
    (True, [0.5, 0.7, 0.95, 0.99], 0.95),   # accuracy reaches the target at epoch 3
    (False, [0.9, 0.5, 0.009, 0.001], 0.01),  # a loss falls below it at epoch 3
])
def test_target_score_ends_growth_when_reached(maximize, scores, target):
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)))
    ctl = GrowthController(model, maximize=maximize, target_score=target,
                           switch_mode="every_epoch", max_dendrites=10, write_files=False)
    actions = []
    for score in scores:
        decision = ctl.step(score)
        actions.append(decision.action)
        if decision.complete:
            break
    assert actions == ["restructure", "restructure", "complete"]
    assert "target_score" in decision.reason and ctl.num_dendrites == 2
