"""A parameter frozen by the user stays frozen through growth, rewind, load and every rule
phase; a frozen layer still gets trainable dendrites (the adapter use)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import perfora


def _backbone_and_head() -> tuple[nn.Module, list[str]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                          nn.LayerNorm(8), nn.Linear(8, 3))
    frozen = []
    for name, p in model.named_parameters():
        if not name.startswith("5."):
            p.requires_grad_(False)
            frozen.append(name)
    return model, frozen


def _frozen_values(model: nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    by_name = {n.replace(".base", ""): p for n, p in model.named_parameters()}
    return {n: by_name[n].detach().clone() for n in names}


def _epoch(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
           y: torch.Tensor) -> float:
    model.train()
    for _ in range(3):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    return loss.item()


def _assert_frozen(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    by_name = {n.replace(".base", ""): p for n, p in model.named_parameters()}
    for name, value in before.items():
        assert not by_name[name].requires_grad, f"{name} was unfrozen"
        assert torch.equal(by_name[name].detach(), value), f"{name} changed"


@pytest.mark.parametrize("rule", ["gd", "correlation"])
def test_frozen_backbone_stays_frozen_and_its_dendrites_train(rule, tmp_path):
    model, frozen = _backbone_and_head()
    before = _frozen_values(model, frozen)
    perfora.perforate(model)
    report = str(perfora.describe(model))
    assert "0  Linear  neurons=8 axis=-1 dendrites=0  base frozen" in report
    ctl = perfora.GrowthController(model, rule=rule, seed=0, dendrite_init="default",
                                   growth="dendrites",
                                   n_epochs_to_switch=2, max_dendrites=2,
                                   run_dir=tmp_path, checkpoint_time_budget=None)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-2)
    optimizer, _ = ctl.build_optimizer()
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in held for n, p in model.named_parameters()
                   if n.replace(".base", "") in frozen)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    layer0 = perfora.dendritic_layers(model)["0"]
    grew = False
    scores = [1.0, 1.0, 1.0] + [0.9] * 40
    for score in scores:
        _epoch(model, ctl.optimizer, x, y)
        _assert_frozen(model, before)
        decision = ctl.step(score)
        _assert_frozen(model, before)
        if layer0.num_dendrites and not grew:
            grew = True
            bank = [p.detach().clone() for g in ("bank", "candidate")
                    for p in layer0.group_parameters(g)]
        if decision.complete:
            break
    assert grew
    assert ctl.completed  # completion rewound to the best model
    _assert_frozen(model, before)
    assert bank  # (the rewind may drop the dendrites again; the load below brings them)

    fresh, _ = _backbone_and_head()
    resumed = perfora.resume(fresh, ctl.checkpoint_path("latest"), optimizer=torch.optim.Adam,
                             optimizer_args={"lr": 1e-2})
    by_name = dict(fresh.named_parameters())
    for name in frozen:
        assert not by_name[name.replace(".", ".base.", 1) if name[0] in "02" else name] \
            .requires_grad
    held = {id(p) for g in resumed.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in held for p in fresh.parameters() if not p.requires_grad)


def test_adapter_only_dendrites_train_on_a_frozen_model():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 2))
    for p in model.parameters():
        p.requires_grad_(False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    perfora.perforate(model)
    ctl = perfora.GrowthController(model, seed=0)
    ctl.set_optimizer(torch.optim.Adam, lr=5e-2)
    x = torch.randn(64, 5)
    y = (x[:, 0] * x[:, 1] > 0).long()
    ctl.build_optimizer() if False else None
    decision = ctl.add_dendrites()  # nothing trainable before growth: build after it
    first = F.cross_entropy(model(x), y).item()
    for _ in range(40):
        decision.optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        decision.optimizer.step()
    assert F.cross_entropy(model(x), y).item() < first - 0.05  # the dendrites learned
    for name, p in model.named_parameters():
        if ".base." in name:
            assert not p.requires_grad
            assert torch.equal(p.detach(), before[name.replace(".base", "")])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".base." not in n for n in trainable)


def test_freezing_after_perforate_is_respected_by_the_controller():
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
    for p in model[0].base.parameters():
        p.requires_grad_(False)
    ctl = perfora.GrowthController(model, seed=0)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    ctl.build_optimizer()
    ctl.add_dendrites()
    assert not any(p.requires_grad for p in model[0].base.parameters())
    assert all(p.requires_grad for p in model[0].group_parameters("bank"))
    assert all(p.requires_grad for p in model[1].base.parameters())


def test_nothing_trainable_is_a_clear_error():
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 2)))
    for p in model.parameters():
        p.requires_grad_(False)
    ctl = perfora.GrowthController(model)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    with pytest.raises(perfora.ConfigError, match="no parameter of the model requires"):
        ctl.build_optimizer()


@pytest.mark.parametrize("grow", ["add_dendrites", "plateau", "add_neurons"])
def test_freezing_changed_during_training_is_kept_through_growth(grow):
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8),
                                            nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                                            nn.Linear(8, 3)))
    model[0].base.requires_grad_(False)  # frozen when the controller starts
    ctl = perfora.GrowthController(model, write_files=False, growth="dendrites",
                                   n_epochs_to_switch=1, max_dendrites=2)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    ctl.build_optimizer()
    ctl.step(1.0)
    model[0].base.requires_grad_(True)  # gradual unfreezing
    model[4].base.requires_grad_(False)  # and a layer frozen later
    if grow == "plateau":
        assert ctl.step(1.0).restructured
    else:
        getattr(ctl, grow)()
    flags = {path: all(p.requires_grad for p in layer.base.parameters())
             for path, layer in perfora.dendritic_layers(ctl.model).items()}
    assert flags == {"0": True, "2": True, "4": False, "6": True}
