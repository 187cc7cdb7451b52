"""The correlation rule: dendrite phase (candidates train on the error correlation, all else
frozen, function unchanged), neuron phase, exact resume, and an end-to-end run."""

from __future__ import annotations

import csv
import math

import pytest
import torch
from torch import nn

from perfora import (
    ConfigError,
    GrowthController,
    PerforaConfig,
    PerforationError,
    dendritic_layers,
    perforate,
)
from perfora.nn.layers import DendriticLayer
from perfora.rules.correlation import CorrelationTap, correlation_gradient

X = torch.linspace(-2, 2, 96).unsqueeze(1) * torch.tensor([[1.0, -0.7]])
X = X + 0.3 * torch.randn(96, 2, generator=torch.Generator().manual_seed(1))
X = X[torch.randperm(96, generator=torch.Generator().manual_seed(2))]  # batches mix the range
Y = (torch.sin(3 * X[:, :1]) * torch.cos(2 * X[:, 1:]))


def make_model(seed: int = 0, norm: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    layers = [nn.Linear(2, 4), nn.Tanh()]
    if norm:
        layers.append(nn.LayerNorm(4))
    return perforate(nn.Sequential(*layers, nn.Linear(4, 1)), types=(nn.Linear,))


def make_controller(model: nn.Module, **settings) -> GrowthController:
    settings = {"rule": "correlation", "maximize": False, "n_epochs_to_switch": 3,
                "max_dendrites": 3, "improvement_threshold": 0.01, **settings}
    ctl = GrowthController(model, write_files=False, **settings)
    ctl.set_optimizer(torch.optim.AdamW, lr=0.02, weight_decay=0.1)
    ctl.build_optimizer()
    return ctl


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model.train()
    for i in range(0, len(X), 16):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(X[i:i + 16]), Y[i:i + 16]).backward()
        optimizer.step()


def val_loss(model: nn.Module) -> float:
    model.eval()
    with torch.no_grad():
        return nn.functional.mse_loss(model(X), Y).item()


def run(ctl: GrowthController, epochs: int, stop_at_phase: str | None = None) -> list:
    """Train and report; returns the decisions (stops early at completion or phase)."""
    decisions = []
    for _ in range(epochs):
        train_epoch(ctl.model, ctl.optimizer)
        decision = ctl.step(val_loss(ctl.model))
        decisions.append(decision)
        if decision.complete or (stop_at_phase and decision.phase == stop_at_phase):
            break
    return decisions


def into_dendrite_phase(ctl: GrowthController, neuron_epochs: int = 4,
                        additions: int = 1) -> None:
    run(ctl, neuron_epochs)
    for _ in range(additions):
        ctl.add_dendrites()
    assert ctl.phase == "dendrite"


def trainable(model: nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def clone_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# --------------------------------------------------------------------------- objective
def test_correlation_gradient_matches_autograd_of_the_objective():
    gen = torch.Generator().manual_seed(3)
    d = torch.rand(5, 3, 4, 4, generator=gen, dtype=torch.float64).requires_grad_()
    err = torch.randn(5, 3, 4, 4, generator=gen, dtype=torch.float64)
    grad, corr = correlation_gradient(d, err, axis=1)
    dm = d.movedim(1, -1).reshape(-1, 3)
    em = err.movedim(1, -1).reshape(-1, 3)
    e_hat = (em - em.mean(0)) / (em - em.mean(0)).square().mean(0).sqrt()
    objective = ((dm - dm.mean(0)) * e_hat).mean(0).abs().sum()
    (expected,) = torch.autograd.grad(-objective, d)
    torch.testing.assert_close(grad, expected)
    pearson = torch.stack([torch.corrcoef(torch.stack([dm[:, o], em[:, o]]))[0, 1].abs()
                           for o in range(3)])
    torch.testing.assert_close(corr, pearson)


def tapped_candidate(gen: torch.Generator) -> tuple[DendriticLayer, CorrelationTap]:
    """A Linear(3, 2) whose one dendrite is a candidate apart, alone trainable, tapped."""
    layer = DendriticLayer(nn.Linear(3, 2), num_neurons=2, neuron_axis=-1)
    layer.grow(gen)
    layer.split_candidate()
    layer.set_trainable(base=False, bank=False, cascade=False, out=False, candidate=True)
    tap = CorrelationTap(axis=-1)
    layer.candidate_tap = tap
    return layer, tap


def test_correlation_objective_increases_on_a_learnable_error():
    """A fixed, learnable error G = dL/dy: the candidate learns to correlate with it."""
    gen = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    layer, tap = tapped_candidate(gen)
    x = torch.randn(256, 3, generator=gen)
    err = torch.sigmoid(4 * x @ torch.tensor([[1.0, -2.0], [0.5, 1.0], [-1.0, 0.0]]))

    def full_correlation() -> torch.Tensor:
        with torch.no_grad():
            d = layer._candidate_output(x, [], [1, 2])
        return correlation_gradient(d, err, -1)[1]

    start = full_correlation()
    optimizer = torch.optim.Adam(layer.group_parameters("candidate"), lr=0.05)
    epoch_scores = []
    for _ in range(15):
        for i in range(0, 256, 32):
            optimizer.zero_grad()
            (layer(x[i:i + 32]) * err[i:i + 32]).sum().backward()  # dL/dy = err exactly
            optimizer.step()
        epoch_scores.append(tap.take())
    end = full_correlation()
    assert (end > start + 0.2).all() and (end > 0.9).all(), (start, end)
    assert epoch_scores[-1] > epoch_scores[0] + 0.2, epoch_scores
    assert layer.base.weight.grad is None, "the neuron layer is frozen"


def test_an_empty_batch_leaves_the_candidate_and_its_statistics_alone():
    """An empty batch (an uneven last shard) has no mean: it must not put NaN into the
    running covariance sign, which would make every later candidate gradient NaN."""
    gen = torch.Generator().manual_seed(5)
    layer, tap = tapped_candidate(gen)
    x = torch.randn(16, 3, generator=gen)
    layer(x).sum().backward()
    trend, moments = tap.trend.clone(), tap.moments.clone()
    layer.zero_grad()
    layer(x[:0]).sum().backward()
    assert torch.equal(tap.trend, trend) and torch.equal(tap.moments, moments)
    assert all(p.grad.abs().sum() == 0 for p in layer.group_parameters("candidate"))
    layer(x).sum().backward()
    assert all(p.grad.isfinite().all() for p in layer.group_parameters("candidate"))
    assert math.isfinite(tap.take())


def test_a_transform_during_the_dendrite_phase_is_refused_with_what_to_do():
    """The candidate learns from the tap in an ordinary backward pass; under torch.func it
    would silently not learn, so the layer says so instead."""
    from torch.func import functional_call, grad

    layer, _ = tapped_candidate(torch.Generator().manual_seed(6))
    params = {n: p.detach() for n, p in layer.named_parameters()}
    with pytest.raises(PerforationError, match=r"loss\.backward\(\)"):
        grad(lambda p: functional_call(layer, p, (torch.randn(4, 3),)).sum())(params)
    (layer(torch.randn(8, 3)) * torch.randn(8, 2)).sum().backward()  # this one trains it
    assert all(p.grad.abs().sum() > 0 for p in layer.group_parameters("candidate"))


def test_the_rule_reports_a_rising_correlation_score():
    ctl = make_controller(make_model(), correlation_patience=100,
                          correlation_max_epochs_ratio=100.0)
    into_dendrite_phase(ctl)
    scores = []
    for _ in range(20):
        run(ctl, 1)
        scores.append(ctl.rule.metrics()["corr"])
    assert ctl.phase == "dendrite"
    assert scores[-1] > scores[0], scores
    assert all(0 <= v <= 1 for v in scores)
    assert set(ctl.rule.metrics()) == {"corr", "corr/0", "corr/2"}


# --------------------------------------------------------------------------- dendrite phase
@pytest.mark.parametrize("additions", [1, 2])
def test_only_candidates_train_and_everything_else_is_bitwise_frozen(additions):
    model = make_model(norm=True)
    ctl = make_controller(model, correlation_patience=100, correlation_max_epochs_ratio=100.0)
    ctl.rule.bind_model(model)
    into_dendrite_phase(ctl, additions=additions)
    expected = {n for n, _ in model.named_parameters() if ".candidate_" in n}
    assert trainable(model) == expected
    in_optimizer = {id(p) for g in ctl.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in model.parameters() if p.requires_grad}
    before = clone_params(model)
    run(ctl, 3)
    assert ctl.phase == "dendrite"
    after = clone_params(model)
    for name in before:
        if name in expected:
            assert not torch.equal(before[name], after[name]), f"{name} did not train"
        else:
            assert torch.equal(before[name], after[name]), f"{name} changed while frozen"
    # no dead parameters: every trainable tensor gets a gradient
    model.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(X), Y).backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == p.requires_grad, name


def test_network_output_is_unchanged_during_the_dendrite_phase():
    model = make_model()
    ctl = make_controller(model, correlation_patience=100, correlation_max_epochs_ratio=100.0)
    run(ctl, 4)
    ctl.add_dendrites()
    ctl.add_dendrites()  # a second set: cascade and older dendrites in play
    model.eval()
    with torch.no_grad():
        reference = model(X)
    vals = [d for d in run(ctl, 4)]
    assert all(d.phase == "dendrite" for d in vals)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(X), reference)
    model.train()
    with torch.enable_grad():
        assert torch.equal(model(X), reference), "the tap must be the identity in forward"
    rows = ctl.state.history[-4:]
    assert len({r["val_score"] for r in rows}) == 1
    assert all(r["running_score"] is None for r in rows), "dendrite epochs are not counted"


def test_no_error_flows_through_the_candidate_into_the_network():
    model = make_model()
    ctl = make_controller(model)
    into_dendrite_phase(ctl)
    for layer in dendritic_layers(model).values():
        layer.set_trainable(base=True)  # let the base receive gradients to inspect them
    model.zero_grad(set_to_none=True)
    x = X.clone().requires_grad_()
    nn.functional.mse_loss(model(x), Y).backward()
    grad_with = x.grad.clone()
    first = dendritic_layers(model)["0"]
    grads = [p.grad.clone() for p in first.base.parameters()]
    x.grad = None
    for p in model.parameters():
        p.grad = None
    for layer in dendritic_layers(model).values():
        layer.candidate_tap = None  # candidate out of the graph
    nn.functional.mse_loss(model(x), Y).backward()
    assert torch.equal(x.grad, grad_with)
    for g, p in zip(grads, first.base.parameters(), strict=True):
        assert torch.equal(g, p.grad)


def test_trainable_sets_per_phase_and_phase_end():
    model = make_model()
    ctl = make_controller(model, correlation_patience=2, correlation_max_epochs_ratio=1.0)
    base_names = {n for n, _ in model.named_parameters() if ".base." in n}
    assert trainable(model) == base_names
    run(ctl, 4)
    ctl.add_dendrites()
    assert ctl.rule.cap == 4
    decisions = run(ctl, 10, stop_at_phase="neuron")
    assert decisions[-1].action == "phase_change" and decisions[-1].restructured
    assert len(decisions) <= 4
    assert decisions[-1].optimizer is ctl.optimizer
    layers = dendritic_layers(model)
    assert not any(layer.has_candidate for layer in layers.values())
    assert trainable(model) == base_names | {f"{p}.out_weight" for p in layers}
    in_optimizer = {id(p) for g in ctl.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in model.parameters() if p.requires_grad}


def test_outside_parameters_are_frozen_then_restored():
    model = make_model(norm=True)
    ctl = make_controller(model, correlation_patience=1)
    ctl.rule.bind_model(model)
    norm = model[2]
    norm.bias.requires_grad_(False)  # the user froze this one: it stays frozen
    into_dendrite_phase(ctl)
    assert not norm.weight.requires_grad
    run(ctl, 10, stop_at_phase="neuron")
    assert ctl.phase == "neuron"
    assert norm.weight.requires_grad and not norm.bias.requires_grad


# --------------------------------------------------------------------------- save / load
def test_save_and_load_in_the_middle_of_a_dendrite_phase_resumes_exactly(tmp_path):
    settings = {"correlation_patience": 100, "correlation_max_epochs_ratio": 2.0}
    ctl = make_controller(make_model(), **settings)
    into_dendrite_phase(ctl, additions=2)
    run(ctl, 2)
    path = tmp_path / "mid.safetensors"
    ctl.save(path)
    rest = run(ctl, 12)
    assert any(d.action == "phase_change" for d in rest), "the run should leave the phase"

    fresh = make_controller(make_model(seed=5), **settings)
    fresh.load(path)
    assert fresh.phase == "dendrite"
    assert all(layer.has_candidate for layer in dendritic_layers(fresh.model).values())
    again = run(fresh, 12)
    assert [(d.action, d.phase) for d in again] == [(d.action, d.phase) for d in rest]
    assert ([r["val_score"] for r in fresh.state.history] ==
            [r["val_score"] for r in ctl.state.history])
    assert fresh.state.history[-1].get("rule/corr") == ctl.state.history[-1].get("rule/corr")
    got, want = fresh.model.state_dict(), ctl.model.state_dict()
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_state_dict_while_split_is_the_merged_form():
    model = make_model()
    ctl = make_controller(model)
    run(ctl, 2)
    ctl.add_dendrites()
    ctl.add_dendrites()
    split = {k: v.clone() for k, v in model.state_dict().items()}
    for layer in dendritic_layers(model).values():
        layer.merge_candidate()
    merged = model.state_dict()
    assert sorted(split) == sorted(merged)
    for key in merged:
        assert torch.equal(split[key], merged[key]), key


# --------------------------------------------------------------------------- end to end
def test_end_to_end_run_grows_and_completes(tmp_path):
    model = make_model()
    ctl = GrowthController(model, run_dir=tmp_path, rule="correlation", maximize=False,
                           n_epochs_to_switch=3, max_dendrites=2, improvement_threshold=0.01,
                           correlation_patience=2)
    ctl.set_optimizer(torch.optim.Adam, lr=0.02)
    ctl.build_optimizer()
    decisions = run(ctl, 300)
    assert decisions[-1].complete
    phases = [r["phase"] for r in ctl.state.history]
    assert "dendrite" in phases and ctl.state.additions >= 1
    assert any(d.action == "phase_change" for d in decisions)
    with open(tmp_path / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert "rule/corr" in rows[0] and "rule/corr/0" in rows[0]
    corr = [float(r["rule/corr"]) for r in rows if r["phase"] == "dendrite"]
    assert corr and all(0 <= c <= 1 for c in corr)
    assert val_loss(model) == pytest.approx(ctl.best_score, rel=1e-6)
    assert not any(layer.has_candidate for layer in dendritic_layers(model).values())


# --------------------------------------------------------------------------- settings
@pytest.mark.parametrize("name, value", [
    ("correlation_patience", 0), ("correlation_threshold", -0.1),
    ("correlation_threshold", math.inf), ("correlation_max_epochs_ratio", 0),
    ("correlation_max_epochs_ratio", "1")])
def test_bad_correlation_settings_raise(name, value):
    with pytest.raises(ConfigError, match=name):
        PerforaConfig(rule="correlation", **{name: value})


def test_split_refuses_a_live_dendrite():
    layer = DendriticLayer(nn.Linear(3, 2), num_neurons=2, neuron_axis=-1)
    layer.grow()
    with torch.no_grad():
        layer.out_weight.fill_(1.0)
    with pytest.raises(Exception, match="nonzero v row"):
        layer.split_candidate()
