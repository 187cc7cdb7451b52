"""The controller rebuilds the user's optimizer and scheduler after every restructure.

Same type, same hyperparameters, exactly the trainable parameters (new dendrites included),
schedulers stepped the right way; plus a short real training run in which the rebuilt
optimizer actually trains the new dendrites.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import ReduceLROnPlateau, StepLR

from perfora import ConfigError, GrowthController, OrderError, dendritic_layers, perforate

C, R, DONE = "continue", "restructure", "complete"

# Scripted tests step the scheduler without any optimizer.step(): torch warns about the order.
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")

# Two scripted cycles: a plateau at epoch 4 (first set), a better cycle, a plateau at 7.
TWO_RESTRUCTURES = [1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0]


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return perforate(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))


def controller(**settings) -> GrowthController:
    settings.setdefault("n_epochs_to_switch", 2)
    settings.setdefault("growth", "dendrites")
    return GrowthController(make_model(), **settings)


def opt_param_ids(opt: torch.optim.Optimizer) -> list[int]:
    return [id(p) for group in opt.param_groups for p in group["params"]]


def trainable_ids(model: nn.Module) -> set[int]:
    return {id(p) for p in model.parameters() if p.requires_grad}


def hyper(opt: torch.optim.Optimizer) -> list[dict]:
    """Every param-group setting except the parameters themselves."""
    return [{k: v for k, v in g.items() if k not in ("params", "initial_lr")}
            for g in opt.param_groups]


def assert_covers_trainables(opt: torch.optim.Optimizer, model: nn.Module) -> None:
    ids = opt_param_ids(opt)
    assert len(ids) == len(set(ids)), "a parameter is in the optimizer twice"
    assert set(ids) == trainable_ids(model)


def dendrite_params(model: nn.Module) -> list[nn.Parameter]:
    out = []
    for layer in dendritic_layers(model).values():
        for group in ("bank", "cascade", "out"):
            out += layer.group_parameters(group)
    return out


# --------------------------------------------------------------------------- Adam + StepLR
def test_adam_and_steplr_are_rebuilt_after_each_restructure():
    ctl = controller(dendrite_optimizer="restart")  # the default, PerforatedAI's way ('carry':
    # test_dendrite_optimizer.py)
    ctl.set_optimizer(torch.optim.Adam, lr=3e-3, weight_decay=1e-4, betas=(0.8, 0.95))
    ctl.set_scheduler(StepLR, step_size=2, gamma=0.5)
    opt, sched = ctl.build_optimizer()
    assert isinstance(opt, torch.optim.Adam) and isinstance(sched, StepLR)
    assert_covers_trainables(opt, ctl.model)
    first_hyper = hyper(opt)
    assert first_hyper[0]["lr"] == 3e-3 and first_hyper[0]["weight_decay"] == 1e-4
    assert tuple(first_hyper[0]["betas"]) == (0.8, 0.95)

    seen_opts = [opt]
    for score in TWO_RESTRUCTURES:
        d = ctl.step(score)
        assert d.optimizer is ctl.optimizer and d.scheduler is ctl.scheduler
        if d.action == C:
            assert d.optimizer is seen_opts[-1]           # not rebuilt without a change
            continue
        assert d.action == R
        new = d.optimizer
        assert all(new is not old for old in seen_opts)
        seen_opts.append(new)
        assert type(new) is torch.optim.Adam
        assert hyper(new) == first_hyper                  # lr back to the configured value
        assert_covers_trainables(new, d.model)
        ids = set(opt_param_ids(new))
        news = dendrite_params(d.model)
        assert news and all(id(p) in ids for p in news)
        assert all(p.requires_grad for p in news)
        sched = d.scheduler
        assert type(sched) is StepLR and sched.optimizer is new
        assert sched.step_size == 2 and sched.gamma == 0.5
        assert sched.last_epoch == 0
    assert len(seen_opts) == 3
    # the second set brings a cascade (w) parameter: it must be trained too
    for layer in dendritic_layers(ctl.model).values():
        assert layer.cascade is not None and id(layer.cascade) in set(opt_param_ids(seen_opts[-1]))


def test_steplr_steps_once_per_continue_epoch():
    ctl = controller(n_epochs_to_switch=3, dendrite_optimizer="restart")
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    ctl.set_scheduler(StepLR, step_size=2, gamma=0.5)
    _, sched = ctl.build_optimizer()
    epochs, lrs = [], []
    for score in [1.0, 2.0, 2.0, 2.0, 2.0]:
        d = ctl.step(score)
        epochs.append(d.scheduler.last_epoch)
        lrs.append(d.optimizer.param_groups[0]["lr"])
    # restructure at epoch 5 (patience 3 after epoch 2): a fresh scheduler, not stepped
    assert [ctl.state.history[i]["event"] for i in range(5)] == ["", "", "", "", R]
    assert epochs == [1, 2, 3, 4, 0]
    assert lrs == pytest.approx([0.1, 0.05, 0.05, 0.025, 0.1])
    d = ctl.step(3.0)
    assert d.action == C and d.scheduler.last_epoch == 1
    d = ctl.step(4.0)
    assert d.scheduler.last_epoch == 2
    assert d.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_retry_of_a_failed_set_gets_a_new_optimizer_over_the_new_dendrites():
    ctl = controller(max_dendrite_tries=2, retain_all_dendrites=False)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    ctl.build_optimizer()
    ds = [ctl.step(s) for s in [1.0, 2.0, 2.0, 2.0]]
    first = ds[-1].optimizer
    ds = [ctl.step(s) for s in [1.0, 1.0, 1.0]]      # the set fails: retried
    assert [d.action for d in ds] == [C, C, R]
    retry = ds[-1].optimizer
    assert retry is not first and ctl.num_dendrites == 1
    assert_covers_trainables(retry, ctl.model)
    for layer in dendritic_layers(ctl.model).values():   # the fresh dendrite is trained
        assert id(layer.bank_weight) in opt_param_ids(retry)
        assert id(layer.bank_weight) not in opt_param_ids(first)


# --------------------------------------------------------------------------- ReduceLROnPlateau
def test_reduce_on_plateau_is_stepped_with_the_score():
    ctl = controller(n_epochs_to_switch=10)
    ctl.set_optimizer(torch.optim.SGD, lr=1.0)
    ctl.set_scheduler(ReduceLROnPlateau, mode="max", patience=1, factor=0.5)
    _, sched = ctl.build_optimizer()
    bad, lrs = [], []
    for score in [1.0, 0.5, 0.5, 0.5, 0.5, 2.0]:
        d = ctl.step(score)
        assert d.action == C and d.scheduler is sched
        bad.append(sched.num_bad_epochs)
        lrs.append(d.optimizer.param_groups[0]["lr"])
    assert bad == [0, 1, 0, 1, 0, 0]
    assert lrs == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.25, 0.25])
    assert sched.best == 2.0


def test_reduce_on_plateau_minimizing_a_loss():
    ctl = controller(maximize=False, n_epochs_to_switch=10)
    ctl.set_optimizer(torch.optim.SGD, lr=1.0)
    ctl.set_scheduler(ReduceLROnPlateau, mode="min", patience=0, factor=0.1)
    _, sched = ctl.build_optimizer()
    lrs = [ctl.step(s).optimizer.param_groups[0]["lr"] for s in [1.0, 0.5, 0.7, 0.4, 0.6]]
    assert lrs == pytest.approx([1.0, 1.0, 0.1, 0.1, 0.01])
    assert sched.best == 0.4


def test_reduce_on_plateau_is_rebuilt_with_the_same_arguments():
    ctl = controller(dendrite_optimizer="restart")
    ctl.set_optimizer(torch.optim.SGD, lr=1.0)
    ctl.set_scheduler(ReduceLROnPlateau, mode="max", patience=3, factor=0.2, threshold=0.01)
    ctl.build_optimizer()
    ds = [ctl.step(s) for s in [1.0, 2.0, 2.0, 2.0]]
    assert ds[-1].action == R
    sched = ds[-1].scheduler
    assert type(sched) is ReduceLROnPlateau and sched.optimizer is ds[-1].optimizer
    assert (sched.mode, sched.patience, sched.factor, sched.threshold) == ("max", 3, 0.2, 0.01)
    assert sched.num_bad_epochs == 0


def test_reduce_on_plateau_mode_mismatch_warns():
    ctl = controller(maximize=True)
    ctl.set_optimizer(torch.optim.SGD, lr=1.0)
    ctl.set_scheduler(ReduceLROnPlateau, mode="min")
    with pytest.warns(UserWarning, match="mode='max'"):
        ctl.build_optimizer()


# --------------------------------------------------------------------------- other optimizers
@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True,
                           "weight_decay": 1e-4, "dampening": 0.0}),
        (torch.optim.AdamW, {"lr": 2e-3, "betas": (0.85, 0.97), "eps": 1e-6,
                             "weight_decay": 0.05, "amsgrad": True}),
        (torch.optim.Adam, {"lr": 1e-3}),
    ],
    ids=["sgd-nesterov", "adamw", "adam-defaults"],
)
def test_optimizer_type_and_hyperparameters_survive_restructures(cls, kwargs):
    ctl = controller()
    ctl.set_optimizer(cls, **kwargs)
    opt, sched = ctl.build_optimizer()
    assert sched is None
    expected = hyper(opt)
    for key, value in kwargs.items():
        assert expected[0][key] == value
    rebuilt = []
    for score in TWO_RESTRUCTURES:
        d = ctl.step(score)
        if d.restructured:
            rebuilt.append(d.optimizer)
            assert type(d.optimizer) is cls and d.scheduler is None
            assert hyper(d.optimizer) == expected
            assert_covers_trainables(d.optimizer, d.model)
    assert len(rebuilt) == 2 and rebuilt[0] is not rebuilt[1] and rebuilt[0] is not opt


def test_params_key_in_optimizer_kwargs_is_ignored():
    ctl = controller()
    stray = nn.Parameter(torch.zeros(3))
    ctl.set_optimizer(torch.optim.Adam, params=[stray], lr=0.01)
    opt, _ = ctl.build_optimizer()
    assert id(stray) not in opt_param_ids(opt)
    assert_covers_trainables(opt, ctl.model)
    ds = [ctl.step(s) for s in [1.0, 2.0, 2.0, 2.0]]
    assert ds[-1].action == R
    assert_covers_trainables(ds[-1].optimizer, ctl.model)
    assert ds[-1].optimizer.param_groups[0]["lr"] == 0.01


def test_params_generator_as_in_perforatedai_style():
    model = make_model()
    ctl = GrowthController(model, n_epochs_to_switch=2, growth="dendrites")
    optim_args = {"params": model.parameters(), "lr": 0.02, "weight_decay": 0.0}
    ctl.set_optimizer(torch.optim.SGD, **optim_args)
    opt, _ = ctl.build_optimizer()
    assert_covers_trainables(opt, model)
    ds = [ctl.step(s) for s in [1.0, 2.0, 2.0, 2.0]]
    assert_covers_trainables(ds[-1].optimizer, model)


def test_frozen_parameters_stay_out_of_the_rebuilt_optimizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    perforate(model, paths=["0"])
    model[2].weight.requires_grad_(False)
    ctl = GrowthController(model, n_epochs_to_switch=2, growth="dendrites")
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    opt, _ = ctl.build_optimizer()
    assert id(model[2].weight) not in opt_param_ids(opt)
    ds = [ctl.step(s) for s in [1.0, 2.0, 2.0, 2.0]]
    assert ds[-1].action == R
    ids = opt_param_ids(ds[-1].optimizer)
    assert id(model[2].weight) not in ids and id(model[2].bias) in ids
    assert_covers_trainables(ds[-1].optimizer, model)


def test_set_optimizer_instance_is_used_and_dropped_after_restructure():
    ctl = controller()
    opt = torch.optim.SGD(ctl.model.parameters(), lr=0.1)
    sched = StepLR(opt, step_size=1, gamma=0.5)
    ctl.set_optimizer_instance(opt, sched)  # the documented way: no warning (see usage tests)
    ds = [ctl.step(s) for s in [1.0, 2.0, 2.0]]
    assert all(d.optimizer is opt and d.scheduler is sched for d in ds)
    assert sched.last_epoch == 3                       # the controller steps it
    d = ctl.step(2.0)
    assert d.action == R and d.restructured
    assert d.optimizer is None and d.scheduler is None
    assert ctl.optimizer is None
    # the user rebuilds over the grown model and hands it back
    new = torch.optim.SGD(d.model.parameters(), lr=0.1)
    ctl.set_optimizer_instance(new)
    assert ctl.step(3.0).optimizer is new


@pytest.mark.parametrize("scheduler_first", [False, True])
def test_set_scheduler_with_an_optimizer_instance_is_built_over_it_and_stepped(
        scheduler_first):
    ctl = controller()
    opt = torch.optim.SGD(ctl.model.parameters(), lr=0.1)
    if scheduler_first:
        ctl.set_scheduler(StepLR, step_size=1, gamma=0.5)
        ctl.set_optimizer_instance(opt)
    else:
        ctl.set_optimizer_instance(opt)
        ctl.set_scheduler(StepLR, step_size=1, gamma=0.5)
    assert isinstance(ctl.scheduler, StepLR) and ctl.scheduler.optimizer is opt
    ds = [ctl.step(s) for s in [1.0, 2.0, 2.0]]
    assert ds[-1].scheduler is ctl.scheduler
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 3)  # it used to stay 0.1
    d = ctl.step(2.0)
    assert d.restructured and d.scheduler is None
    new = torch.optim.SGD(d.model.parameters(), lr=0.1)
    ctl.set_optimizer_instance(new)  # the next one gets the registered scheduler too
    assert isinstance(ctl.scheduler, StepLR) and ctl.scheduler.optimizer is new


def test_set_optimizer_instance_rejects_non_optimizers():
    ctl = controller()
    with pytest.raises(OrderError, match="Optimizer"):
        ctl.set_optimizer_instance(torch.optim.SGD)


@pytest.mark.parametrize("register, match", [
    (lambda ctl: ctl.set_optimizer(torch.optim.Adam, learning_rate=1e-3),
     "the arguments given for Adam: got an unexpected keyword argument 'learning_rate'; it "
     "takes lr, betas"),
    (lambda ctl: ctl.set_scheduler(StepLR, gamma=0.5),
     "the arguments given for StepLR: missing a required argument: 'step_size'"),
    (lambda ctl: ctl.set_optimizer(torch.optim.SGD(ctl.model.parameters(), lr=0.1)),
     r"got a SGD you built: give set_optimizer_instance\(optimizer\) that one"),
])
def test_arguments_the_optimizer_would_refuse_are_refused_when_registered(register, match):
    """Not at the first build, or epochs later at a restructure's rebuild."""
    ctl = controller()
    with pytest.raises(ConfigError, match=match):
        register(ctl)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3, params=None)  # params is dropped, as before
    ctl.set_scheduler(ReduceLROnPlateau, mode="max", patience=2)
    optimizer, scheduler = ctl.build_optimizer()
    assert optimizer.param_groups[0]["lr"] == 1e-3 and scheduler.patience == 2


def test_set_optimizer_instance_refuses_an_optimizer_over_another_model():
    """Its steps would train the other model; the grown one would never change."""
    ctl = controller()
    other = make_model(seed=1)
    with pytest.raises(ConfigError, match="holds none of this model's parameters"):
        ctl.set_optimizer_instance(torch.optim.SGD(other.parameters(), lr=0.1))
    assert ctl.optimizer is None
    own = torch.optim.SGD(ctl.model.parameters(), lr=0.1)
    ctl.set_optimizer_instance(own)
    assert ctl.optimizer is own


# --------------------------------------------------------------------------- real training
def test_short_training_run_grows_and_trains_new_dendrites():
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = torch.sin(2 * x[:, :1]) + x[:, 1:2] * x[:, 2:3]
    xv = torch.randn(128, 4)
    yv = torch.sin(2 * xv[:, :1]) + xv[:, 1:2] * xv[:, 2:3]
    model = perforate(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)))
    ctl = GrowthController(model, maximize=False, switch_mode="fixed", fixed_switch_num=2,
                           growth="dendrites",
                           max_dendrites=2, max_dendrite_tries=3)
    ctl.set_optimizer(torch.optim.Adam, lr=3e-2)
    opt, _ = ctl.build_optimizer()
    loss_fn = nn.MSELoss()

    def val_loss() -> float:
        with torch.no_grad():
            return loss_fn(model(xv), yv).item()

    losses, grew, pending = [val_loss()], [], None
    for _epoch in range(7):
        for i in range(0, len(x), 16):
            opt.zero_grad()
            loss_fn(model(x[i:i + 16]), y[i:i + 16]).backward()
            opt.step()
        if pending is not None:   # the epoch after a restructure trained the new dendrites
            for before, param in pending:
                assert not torch.equal(before, param.detach()), "a new dendrite did not train"
            pending = None
        losses.append(val_loss())
        d = ctl.step(losses[-1])
        if d.restructured:
            grew.append(d.epoch)
            opt = d.optimizer
            assert_covers_trainables(opt, model)
            pending = [(p.detach().clone(), p) for p in dendrite_params(model)]
            assert all(id(p) in set(opt_param_ids(opt)) for _, p in pending)
        if d.complete:
            break
    assert grew[:2] == [2, 4]
    assert {layer.num_dendrites for layer in dendritic_layers(model).values()} == {2}
    assert losses[-1] < 0.5 * losses[0]
    assert ctl.best_score < losses[1]


@pytest.mark.parametrize("growth", ["dendrites", "neurons"])
def test_at_completion_the_optimizer_holds_the_restored_best_models_parameters(growth):
    # completion rewinds to the best (narrower) model; its decision used to hand back the
    # optimizer over the discarded parameters, so training on would train almost nothing
    ctl = controller(growth=growth, n_epochs_to_switch=1, max_dendrites=1, max_neuron_steps=1)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    ctl.build_optimizer()
    for score in (0.6, 0.5, 0.5, 0.5):  # the best at epoch 1, a step at 2, complete after
        decision = ctl.step(score)
        if decision.complete:
            break
    assert decision.complete and decision.model[0].num_dendrites == 0
    assert decision.model[0].num_neurons == 8
    trainable = [id(p) for p in decision.model.parameters() if p.requires_grad]
    assert opt_param_ids(decision.optimizer) == trainable
    assert decision.optimizer is ctl.optimizer


def test_a_per_batch_scheduler_registered_for_epochs_is_warned_about():
    ctl = controller()
    with pytest.warns(UserWarning, match="OneCycleLR is stepped once per batch, but the "
                                         "controller steps a registered scheduler once per "
                                         "epoch"):
        ctl.set_scheduler(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.1, total_steps=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctl.set_scheduler(StepLR, step_size=2)  # an epoch schedule: nothing to say
