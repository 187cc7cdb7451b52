"""Warnings for loops that would train on without their dendrites: each once, at the user's
own ``step()`` call (not at perfora's line), and none for a loop that follows the docs."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import perfora


def _setup(register: bool = True):
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    ctl = perfora.GrowthController(model, seed=0, dendrite_init="default")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if register:
        ctl.set_optimizer(torch.optim.SGD, lr=0.1)
        optimizer, _ = ctl.build_optimizer()
    return model, ctl, optimizer


def _train(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    for _ in range(2):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def _recorded(action) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    return [w for w in caught if issubclass(w.category, UserWarning)]


def test_step_with_no_optimizer_registered_warns_once_at_the_step_call():
    model, ctl, optimizer = _setup(register=False)
    _train(model, optimizer)
    caught = _recorded(lambda: ctl.step(1.0))
    assert [str(w.message)[:38] for w in caught] == ["step() with no optimizer registered: p"]
    assert caught[0].filename == __file__  # this file's ctl.step(), not perfora's own line
    _train(model, optimizer)
    assert _recorded(lambda: ctl.step(1.0)) == []  # once


@pytest.mark.parametrize("grow", ["add_dendrites", "add_neurons"])
def test_training_on_with_the_stale_optimizer_after_growth_warns(grow):
    # after a neuron step the stale optimizer trains only what the widening did not replace
    # (the last layer's bias): as silent as stale dendrites, and worse
    model, ctl, optimizer = _setup()
    _train(model, optimizer)
    ctl.step(1.0)
    decision = getattr(ctl, grow)()
    assert decision.optimizer is not optimizer
    _train(model, optimizer)  # the old optimizer: it does not hold the new parameters
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctl.step(1.0)
    stale = [w for w in caught if "did not change during the epoch since" in str(w.message)]
    assert len(stale) == 1 and stale[0].filename == __file__


def test_training_with_the_optimizer_a_neuron_step_rebuilt_gives_no_warning():
    model, ctl, optimizer = _setup()
    _train(model, optimizer)
    ctl.step(1.0)
    decision = ctl.add_neurons()
    _train(decision.model, decision.optimizer)
    assert _recorded(lambda: ctl.step(1.0)) == []


def _loop_with_your_own_optimizer(reregister: bool, epochs: int = 14) -> tuple[int, list]:
    """The quickstart's loop with set_optimizer_instance: scores that plateau, so it grows."""
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    ctl = perfora.GrowthController(model, seed=0, dendrite_init="default",
                                   n_epochs_to_switch=2, max_dendrites=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    restructures = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctl.set_optimizer_instance(optimizer)
        for epoch in range(epochs):
            _train(model, optimizer)
            decision = ctl.step(1.0 + 0.01 * (epoch % 2))
            if decision.restructured:
                restructures += 1
                if reregister:  # as the quickstart says: a new optimizer, registered again
                    optimizer = torch.optim.SGD(decision.model.parameters(), lr=0.1)
                    ctl.set_optimizer_instance(optimizer)
            if decision.complete:
                break
    return restructures, [w for w in caught if issubclass(w.category, UserWarning)]


def test_your_own_optimizer_registered_again_after_each_restructure_gives_no_warning():
    restructures, caught = _loop_with_your_own_optimizer(reregister=True)
    assert restructures >= 2
    assert [str(w.message) for w in caught] == []


def test_your_own_optimizer_not_registered_again_warns_once_at_the_step_call():
    restructures, caught = _loop_with_your_own_optimizer(reregister=False)
    assert restructures >= 2
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert message.startswith("perfora cannot rebuild an optimizer it did not build")
    assert "pass it to set_optimizer_instance again" in message
    assert caught[0].filename == __file__


def test_training_with_the_rebuilt_optimizer_gives_no_warning():
    model, ctl, optimizer = _setup()
    _train(model, optimizer)
    ctl.step(1.0)
    decision = ctl.add_dendrites()
    _train(model, decision.optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctl.step(1.0)


def test_no_warning_when_the_model_did_not_train_in_the_epoch():
    model, ctl, _ = _setup(register=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctl.step(1.0)  # scores reported without a training pass: nothing to judge


def _direction_warnings(maximize: bool, scores: list[float]) -> list[str]:
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    ctl = perfora.GrowthController(model, maximize=maximize, write_files=False)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    ctl.build_optimizer()
    caught = [w for score in scores for w in _recorded(lambda s=score: ctl.step(s))]
    return [str(w.message) for w in caught if "at each of the first 4" in str(w.message)]


@pytest.mark.parametrize(("maximize", "scores", "fix"), [
    (True, [0.68, 0.66, 0.60, 0.55, 0.50], "set maximize=False"),
    (False, [0.50, 0.61, 0.70, 0.74, 0.80], "set maximize=True"),
])
def test_scores_that_all_get_worse_at_first_question_the_direction_once(maximize, scores, fix):
    # a loss reported with the default maximize=True: every epoch is "worse", and the run
    # would end on its first model without a word
    direction = _direction_warnings(maximize, scores)
    assert len(direction) == 1 and fix in direction[0]


@pytest.mark.parametrize(("maximize", "scores"), [
    (True, [0.5, 0.6, 0.7, 0.8]), (False, [0.7, 0.6, 0.5, 0.4]), (True, [0.7, 0.6, 0.65, 0.5]),
])
def test_scores_that_move_the_right_way_or_mixed_give_no_direction_warning(maximize, scores):
    assert _direction_warnings(maximize, scores) == []


def test_a_model_rolled_back_with_load_state_dict_is_said_at_the_next_step():
    model, ctl, _ = _setup()
    ctl.add_dendrites()
    one_set = {k: v.clone() for k, v in model.state_dict().items()}
    decision = ctl.add_dendrites()
    _train(decision.model, decision.optimizer)
    model.load_state_dict(one_set)  # the model shrinks back, the controller does not know
    assert perfora.dendritic_layers(model)["0"].num_dendrites == 1
    caught = [w for w in _recorded(lambda: ctl.step(0.5))
              if "outside the controller" in str(w.message)]
    assert [str(w.message) for w in caught] == [
        "the model holds 1 dendrite set(s) and 0 neuron step(s), but the controller grew 2 "
        "and 0: the model was changed outside the controller (a model.load_state_dict of "
        "another point of the run?). Go back with the controller instead, which restores the "
        "optimizer with the model: controller.load('best' or 'switch_N') or perfora.resume"]
    assert caught[0].filename == __file__  # at the user's step() line
    assert not [w for w in _recorded(lambda: ctl.step(0.5)) if "outside" in str(w.message)]
