"""GrowthController decisions on scripted score sequences, rewinds, and input validation.

No real training here: a tiny perforated MLP, scores fed by hand, and checks on the
sequence of decisions, the epochs of restructures, the dendrite counts and the weights the
controller rewinds to.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from perfora import (
    ConfigError,
    ConversionError,
    GrowthController,
    OrderError,
    PerforaConfig,
    ScoreError,
    dendritic_layers,
    perforate,
)

C, R, DONE = "continue", "restructure", "complete"


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return perforate(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))


def controller(seed: int = 0, **settings) -> GrowthController:
    """These tests walk through the decision logic set by set, with failed sets discarded
    and retried unless a test asks to retain them (the default retains: see
    test_defaults_retain_sets_and_grow_from_the_error_signal)."""
    settings.setdefault("retain_all_dendrites", False)
    settings.setdefault("growth", "dendrites")
    return GrowthController(make_model(seed), **settings)


def feed(ctl: GrowthController, scores) -> list:
    return [ctl.step(s) for s in scores]


def actions(decisions) -> list[str]:
    return [d.action for d in decisions]


def layer_counts(model: nn.Module) -> set[int]:
    return {layer.num_dendrites for layer in dendritic_layers(model).values()}


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_state_equal(model: nn.Module, expected: dict[str, torch.Tensor]) -> None:
    got = model.state_dict()
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


def perturb(model: nn.Module, amount: float = 0.5) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(amount)


X = torch.randn(5, 4, generator=torch.Generator().manual_seed(123))


# --------------------------------------------------------------------------- directions
def test_maximize_patience_full_run():
    ctl = controller(n_epochs_to_switch=2, max_dendrites=2, max_dendrite_tries=1)
    scores = [0.1, 0.2, 0.2, 0.2,   # plateau at epoch 4 -> first set
              0.3, 0.3, 0.3,        # beats 0.2, plateau at 7 -> second set
              0.4, 0.4, 0.4]        # beats 0.3, plateau at 10: max_dendrites reached
    ds = feed(ctl, scores)
    assert actions(ds) == [C, C, C, R, C, C, R, C, C, DONE]
    assert [d.num_dendrites for d in ds] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert [d.restructured for d in ds] == [a == R for a in actions(ds)]
    assert [d.complete for d in ds] == [False] * 9 + [True]
    assert [d.epoch for d in ds] == list(range(1, 11))
    assert ctl.state.switch_epochs == [4, 7]
    assert ctl.completed and ctl.best_score == pytest.approx(0.4)
    assert ctl.state.best_epoch == 8
    assert layer_counts(ctl.model) == {2}
    assert all(d.model is ctl.model for d in ds)


def test_minimize_losses():
    ctl = controller(maximize=False, n_epochs_to_switch=2, max_dendrites=1,
                     max_dendrite_tries=1)
    ds = feed(ctl, [1.0, 0.5, 0.6, 0.7,   # best 0.5 at epoch 2, plateau at 4
                    0.4, 0.45, 0.5])      # 0.4 beats 0.5, plateau at 7: cap reached
    assert actions(ds) == [C, C, C, R, C, C, DONE]
    assert ctl.best_score == pytest.approx(0.4) and ctl.state.best_epoch == 5


def test_minimize_rising_loss_is_no_improvement():
    ctl = controller(maximize=False, n_epochs_to_switch=2)
    ds = feed(ctl, [1.0, 2.0, 3.0])
    assert actions(ds) == [C, C, R]
    assert ctl.best_score == 1.0 and ctl.state.best_epoch == 1


def test_negative_scores_maximize():
    ctl = controller(n_epochs_to_switch=2)
    ds = feed(ctl, [-5.0, -3.0, -3.5, -4.0])
    assert actions(ds) == [C, C, C, R]
    assert ctl.best_score == -3.0 and ctl.state.best_epoch == 2


def test_negative_scores_minimize():
    ctl = controller(maximize=False, n_epochs_to_switch=2)
    ds = feed(ctl, [-1.0, -2.0, -1.5, -1.8])
    assert actions(ds) == [C, C, C, R]
    assert ctl.best_score == -2.0 and ctl.state.best_epoch == 2


def test_relative_threshold_uses_magnitude_of_negative_best():
    # best -10, 10% relative margin = 1.0: -9.5 is not enough, -8.9 is.
    ctl = controller(improvement_threshold=0.1, improvement_threshold_raw=0.0,
                     n_epochs_to_switch=100)
    feed(ctl, [-10.0, -9.5])
    assert ctl.best_score == -10.0 and ctl.state.best_epoch == 1
    ctl.step(-8.9)
    assert ctl.best_score == -8.9 and ctl.state.best_epoch == 3


# --------------------------------------------------------------------------- zero scores
def test_zero_is_a_real_best_when_maximizing():
    ctl = controller(n_epochs_to_switch=2)
    ds = feed(ctl, [0.0, -1.0, -1.0])
    assert actions(ds) == [C, C, R]
    assert ctl.best_score == 0.0 and ctl.best_score is not None
    assert ctl.state.best_epoch == 1


def test_zero_is_a_real_best_when_minimizing():
    ctl = controller(maximize=False, n_epochs_to_switch=2)
    ds = feed(ctl, [0.0, 0.5, 0.5])
    assert actions(ds) == [C, C, R]
    assert ctl.best_score == 0.0 and ctl.state.best_epoch == 1


def test_repeated_zero_is_not_an_improvement():
    ctl = controller(n_epochs_to_switch=2)
    ds = feed(ctl, [-1.0, 0.0, 0.0, 0.0])
    assert actions(ds) == [C, C, C, R]
    assert ctl.best_score == 0.0 and ctl.state.best_epoch == 2


def test_zero_best_needs_the_raw_margin():
    ctl = controller(improvement_threshold=1e-4, improvement_threshold_raw=1e-3,
                     n_epochs_to_switch=100)
    feed(ctl, [0.0, 5e-4])  # below the raw margin above 0
    assert ctl.best_score == 0.0 and ctl.state.best_epoch == 1
    ctl.step(2e-3)
    assert ctl.best_score == 2e-3 and ctl.state.best_epoch == 3


@pytest.mark.parametrize("zero", [0, 0.0, -0.0, torch.tensor(0.0), np.float64(0.0), np.int64(0)],
                         ids=["int", "float", "negzero", "tensor", "np64", "npint"])
def test_zero_of_any_type_is_a_score(zero):
    ctl = controller(n_epochs_to_switch=2)
    ds = feed(ctl, [-1.0, zero, -0.5, -0.5])
    assert actions(ds) == [C, C, C, R]
    assert ctl.best_score == 0.0 and ctl.state.best_epoch == 2


def test_zero_test_score_is_recorded():
    ctl = controller(n_epochs_to_switch=5)
    assert ctl.best_test_score is None
    ctl.step(0.5, test_score=0.0)
    assert ctl.state.best_test == 0.0 and ctl.best_test_score == 0.0


def test_the_best_test_score_is_the_one_given_at_the_best_validation_epoch():
    ctl = controller(n_epochs_to_switch=5)
    for score, test in [(0.5, 0.40), (0.7, 0.61), (0.6, 0.90)]:  # the last: a worse epoch
        ctl.step(score, test_score=test)
    assert ctl.best_score == 0.7 and ctl.best_test_score == 0.61


# --------------------------------------------------------------------------- thresholds
@pytest.mark.parametrize(
    "rel, raw, best, not_enough, enough",
    [
        (0.1, 0.0, 10.0, 10.5, 11.5),      # relative only: margin 1.0
        (0.0, 1.0, 10.0, 10.5, 11.5),      # raw only: margin 1.0
        (0.01, 0.5, 10.0, 10.3, 10.6),     # both: raw (0.5) is the larger margin
        (0.01, 0.5, 100.0, 100.7, 101.5),  # both: relative (1.0) is the larger margin
    ],
)
def test_improvement_needs_both_margins(rel, raw, best, not_enough, enough):
    ctl = controller(improvement_threshold=rel, improvement_threshold_raw=raw,
                     n_epochs_to_switch=100)
    feed(ctl, [best, not_enough])
    assert ctl.best_score == best and ctl.state.best_epoch == 1
    ctl.step(enough)
    assert ctl.best_score == enough and ctl.state.best_epoch == 3


def test_sub_threshold_gains_do_not_reset_patience():
    ctl = controller(improvement_threshold=0.1, improvement_threshold_raw=0.0,
                     n_epochs_to_switch=2)
    ds = feed(ctl, [10.0, 10.5, 10.9])
    assert actions(ds) == [C, C, R]
    assert ctl.state.switch_epochs == [3]


def test_threshold_sequence_is_indexed_by_dendrite_count():
    # 0 dendrites: any gain counts; 1 dendrite: a 50% relative gain is needed.
    ctl = controller(improvement_threshold=(0.0, 0.5), improvement_threshold_raw=0.0,
                     n_epochs_to_switch=2, max_dendrite_tries=1)
    ds = feed(ctl, [1.0, 1.01, 1.01, 1.01])
    assert actions(ds) == [C, C, C, R]
    ds = feed(ctl, [1.4, 1.4, 1.4])  # +39% over 1.01: not enough with one dendrite
    assert actions(ds) == [C, C, DONE]
    assert ctl.best_score == 1.01


# --------------------------------------------------------------------------- smoothing
def test_history_lookback_changes_decisions():
    scores = [5.0, 1.0, 6.0, 1.0, 1.0]
    raw = controller(n_epochs_to_switch=2, history_lookback=1)
    assert actions(feed(raw, scores)) == [C, C, C, C, R]   # 6.0 at epoch 3 improves
    smooth = controller(n_epochs_to_switch=2, history_lookback=2)
    # running means 5, 3, 3.5: the spike never beats 5 -> plateau at epoch 3
    assert actions(feed(smooth, scores[:3])) == [C, C, R]
    assert smooth.best_score == 5.0


def test_history_lookback_is_a_running_mean():
    ctl = controller(n_epochs_to_switch=100, history_lookback=3)
    feed(ctl, [1.0, 2.0, 3.0, 10.0])
    running = [row["running_score"] for row in ctl.state.history]
    assert running == pytest.approx([1.0, 1.5, 2.0, 5.0])
    assert ctl.best_score == pytest.approx(5.0) and ctl.state.best_epoch == 4


def test_history_lookback_window_restarts_after_restructure():
    ctl = controller(n_epochs_to_switch=2, history_lookback=2)
    assert actions(feed(ctl, [1.0, 1.0, 1.0])) == [C, C, R]
    ctl.step(4.0)
    assert ctl.state.history[-1]["running_score"] == pytest.approx(4.0)
    assert ctl.best_score == pytest.approx(4.0)


# --------------------------------------------------------------------------- switch modes
def test_fixed_mode_switches_on_schedule_even_while_improving():
    ctl = controller(switch_mode="fixed", fixed_switch_num=3, max_dendrites=2)
    ds = feed(ctl, [float(i) for i in range(1, 10)])
    assert actions(ds) == [C, C, R, C, C, R, C, C, DONE]
    assert ctl.state.switch_epochs == [3, 6]
    assert layer_counts(ctl.model) == {2}


def test_patience_mode_does_not_switch_while_improving():
    ctl = controller(switch_mode="patience", n_epochs_to_switch=2)
    ds = feed(ctl, [float(i) for i in range(1, 10)])
    assert actions(ds) == [C] * 9
    assert ctl.num_dendrites == 0


def test_every_epoch_mode():
    ctl = controller(switch_mode="every_epoch", max_dendrites=3)
    ds = feed(ctl, [1.0, 2.0, 3.0, 4.0])
    assert actions(ds) == [R, R, R, DONE]
    assert [d.num_dendrites for d in ds] == [1, 2, 3, 3]
    assert ctl.state.switch_epochs == [1, 2, 3]


def test_never_mode_is_early_stopping():
    ctl = controller(switch_mode="never", n_epochs_to_switch=3, max_dendrites=5)
    ds = feed(ctl, [1.0, 2.0, 3.0, 3.0, 2.5])
    assert actions(ds) == [C] * 5
    assert ctl.step(3.0).action == DONE   # 3 epochs without improvement after epoch 3
    assert ctl.state.switch_epochs == [] and ctl.num_dendrites == 0
    assert layer_counts(ctl.model) == {0}
    assert ctl.best_score == 3.0 and ctl.state.best_epoch == 3


def test_never_mode_keeps_going_while_improving():
    ctl = controller(switch_mode="never", n_epochs_to_switch=2)
    ds = feed(ctl, [0.1 * i for i in range(1, 30)])
    assert actions(ds) == [C] * 29 and not ctl.completed


def test_max_dendrites_zero_is_the_baseline():
    ctl = controller(switch_mode="patience", max_dendrites=0, n_epochs_to_switch=2)
    ds = feed(ctl, [1.0, 2.0, 1.0, 1.0])
    assert actions(ds) == [C, C, C, DONE]
    assert ctl.num_dendrites == 0 and layer_counts(ctl.model) == {0}


def test_max_dendrites_caps_growth():
    ctl = controller(n_epochs_to_switch=1, max_dendrites=1)
    ds = feed(ctl, [1.0, 1.0, 2.0, 2.0])  # the dendrite cycle improves, but the cap is 1
    assert actions(ds) == [C, R, C, DONE]
    assert layer_counts(ctl.model) == {1}


def test_capacity_test_is_off_by_default():
    assert PerforaConfig().capacity_test is False
    ctl = controller(n_epochs_to_switch=3)
    assert actions(feed(ctl, [1.0, 1.0])) == [C, C]


def test_capacity_test_adds_three_sets_then_stops():
    ctl = controller(capacity_test=True, n_epochs_to_switch=50, max_dendrite_tries=1)
    ds = feed(ctl, [1.0, 1.0, 1.0, 1.0])   # no improvement needed
    assert actions(ds) == [R, R, R, DONE]
    assert ctl.state.switch_epochs == [1, 2, 3]
    assert ctl.num_dendrites == 3 and layer_counts(ctl.model) == {3}


# --------------------------------------------------------------------------- retries
def test_failed_set_is_retried_with_fresh_weights_then_completes():
    ctl = controller(n_epochs_to_switch=2, max_dendrite_tries=2, max_dendrites=5)
    feed(ctl, [1.0, 2.0])
    best = snapshot(ctl.model)
    ds = feed(ctl, [2.0, 2.0])
    assert actions(ds) == [C, R]
    first = {p: layer.bank_weight.detach().clone()
             for p, layer in dendritic_layers(ctl.model).items()}

    perturb(ctl.model)
    ds = feed(ctl, [1.5, 1.5, 1.5])           # never beats 2.0: the set failed
    assert actions(ds) == [C, C, R]
    assert ds[-1].num_dendrites == 1 and layer_counts(ctl.model) == {1}
    for path, layer in dendritic_layers(ctl.model).items():
        assert not torch.equal(layer.bank_weight, first[path])   # fresh weights
        assert torch.count_nonzero(layer.out_weight) == 0
        for key in ("weight", "bias"):
            assert torch.equal(getattr(layer.base, key), best[f"{path}.base.{key}"])

    ds = feed(ctl, [1.5, 1.5, 1.5])           # the retry fails too: tries exhausted
    assert actions(ds) == [C, C, DONE]
    assert ctl.state.switch_epochs == [4, 7]
    assert ctl.num_dendrites == 0 and ds[-1].num_dendrites == 0
    assert_state_equal(ctl.model, best)


def test_single_try_completes_at_first_failure():
    ctl = controller(n_epochs_to_switch=2, max_dendrite_tries=1)
    ds = feed(ctl, [1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0])
    assert actions(ds) == [C, C, C, R, C, C, DONE]


def test_successful_retry_lets_growth_continue():
    ctl = controller(n_epochs_to_switch=2, max_dendrite_tries=2, max_dendrites=5)
    ds = feed(ctl, [1.0, 2.0, 2.0, 2.0,   # first set added at 4
                    1.0, 1.0, 1.0,        # fails -> retry at 7
                    3.0, 3.0, 3.0,        # retry beats 2.0 -> second set at 10
                    4.0, 4.0, 4.0])       # second set beats 3.0 -> third set at 13
    assert actions(ds) == [C, C, C, R, C, C, R, C, C, R, C, C, R]
    assert [ds[i].num_dendrites for i in (3, 6, 9, 12)] == [1, 1, 2, 3]
    # the retry budget is per set: the third set may fail once and be retried again
    assert actions(feed(ctl, [1.0, 1.0, 1.0])) == [C, C, R]
    assert ctl.num_dendrites == 3


def test_retain_all_dendrites_keeps_failed_sets_without_rewinding():
    ctl = controller(n_epochs_to_switch=2, max_dendrite_tries=1, max_dendrites=2,
                     retain_all_dendrites=True)
    assert actions(feed(ctl, [1.0, 2.0, 2.0, 2.0])) == [C, C, C, R]
    feed(ctl, [1.0, 1.0])
    perturb(ctl.model)
    before = snapshot(ctl.model)
    d = ctl.step(1.0)                          # the set failed, but it is kept
    assert d.action == R and d.num_dendrites == 2
    for path, layer in dendritic_layers(ctl.model).items():
        # no rewind: the current (post-best) weights are kept, the first dendrite too
        assert torch.equal(layer.base.weight, before[f"{path}.base.weight"])
        n = layer.num_neurons
        assert torch.equal(layer.bank_weight[:n], before[f"{path}.bank_weight"])
        assert torch.equal(layer.out_weight[0], before[f"{path}.out_weight"][0])
        assert torch.count_nonzero(layer.out_weight[1]) == 0
    assert actions(feed(ctl, [1.0, 1.0, 1.0])) == [C, C, DONE]   # cap reached

    strict = controller(n_epochs_to_switch=2, max_dendrite_tries=1, max_dendrites=2)
    assert actions(feed(strict, [1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0]))[-1] == DONE


# --------------------------------------------------------------------------- rewinds
def test_restructure_rewinds_to_best_weights_before_growing():
    ctl = controller(n_epochs_to_switch=2, max_dendrites=3)
    feed(ctl, [1.0, 2.0])
    best_model = copy.deepcopy(ctl.model)
    best = snapshot(ctl.model)
    perturb(ctl.model)
    ctl.step(1.5)
    perturb(ctl.model)
    d = ctl.step(1.5)
    assert d.action == R and d.num_dendrites == 1
    for path, layer in dendritic_layers(ctl.model).items():
        assert torch.equal(layer.base.weight, best[f"{path}.base.weight"])
        assert torch.equal(layer.base.bias, best[f"{path}.base.bias"])
        assert layer.num_dendrites == 1
        assert layer.bank_weight.shape[0] == layer.num_neurons
        assert layer.out_weight.shape == (1, layer.num_neurons)
        assert torch.count_nonzero(layer.out_weight) == 0
        assert torch.count_nonzero(layer.bank_weight) > 0
    with torch.no_grad():
        assert torch.equal(ctl.model(X), best_model(X))   # growth preserves the function

    # second cycle: a new best with one dendrite, then perturbation and a plateau
    ctl.step(3.0)
    best_model = copy.deepcopy(ctl.model)
    best = snapshot(ctl.model)
    perturb(ctl.model)
    feed(ctl, [2.0])
    perturb(ctl.model)
    d = ctl.step(2.0)
    assert d.action == R and d.num_dendrites == 2
    for path, layer in dendritic_layers(ctl.model).items():
        n = layer.num_neurons
        assert torch.equal(layer.base.weight, best[f"{path}.base.weight"])
        assert torch.equal(layer.bank_weight[:n], best[f"{path}.bank_weight"])
        assert torch.equal(layer.out_weight[0], best[f"{path}.out_weight"][0])
        assert torch.count_nonzero(layer.out_weight[1]) == 0
        assert torch.count_nonzero(layer.cascade) == 0
    with torch.no_grad():
        assert torch.equal(ctl.model(X), best_model(X))


def test_completion_restores_best_model_with_fewer_dendrites():
    ctl = controller(n_epochs_to_switch=2, max_dendrite_tries=1)
    feed(ctl, [1.0, 2.0])
    best_model = copy.deepcopy(ctl.model)
    best = snapshot(ctl.model)
    feed(ctl, [2.0, 2.0])
    assert layer_counts(ctl.model) == {1}
    perturb(ctl.model)
    ds = feed(ctl, [1.0, 1.0, 1.0])
    assert actions(ds) == [C, C, DONE]
    assert ds[-1].num_dendrites == 0 and ctl.num_dendrites == 0
    assert layer_counts(ds[-1].model) == {0}
    assert_state_equal(ctl.model, best)
    with torch.no_grad():
        assert torch.equal(ds[-1].model(X), best_model(X))


def test_completion_restores_best_weights_same_structure():
    ctl = controller(switch_mode="never", n_epochs_to_switch=2)
    feed(ctl, [1.0, 3.0])
    best = snapshot(ctl.model)
    perturb(ctl.model)
    ctl.step(2.0)
    perturb(ctl.model)
    assert ctl.step(2.0).action == DONE
    assert_state_equal(ctl.model, best)


# --------------------------------------------------------------------------- independence
def test_several_controllers_are_independent():
    a = controller(seed=1, n_epochs_to_switch=1, max_dendrites=3)
    b = controller(seed=2, maximize=False, n_epochs_to_switch=3, max_dendrites=3)
    got_a, got_b = [], []
    for sa, sb in zip([1.0, 1.0, 2.0, 2.0], [5.0, 4.0, 4.5, 4.5]):
        got_a.append(a.step(sa).action)
        got_b.append(b.step(sb).action)
    assert got_a == [C, R, C, R]
    assert got_b == [C, C, C, C]
    assert a.num_dendrites == 2 and layer_counts(a.model) == {2}
    assert b.num_dendrites == 0 and layer_counts(b.model) == {0}
    assert a.best_score == 2.0 and b.best_score == 4.0
    assert a.config.maximize and not b.config.maximize
    assert b.step(4.5).action == R          # b's own patience: 3 epochs after epoch 2
    assert a.num_dendrites == 2 and b.num_dendrites == 1
    assert a.state.switch_epochs == [2, 4] and b.state.switch_epochs == [5]


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "bad, match",
    [
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (float("-inf"), "inf"),
        (torch.tensor(float("nan")), "nan"),
        (np.float64("nan"), "nan"),
        ("0.9", "str"),
        (None, "NoneType"),
        (True, "bool"),
        (False, "bool"),
        (torch.tensor([0.1, 0.2]), r"\(2,\)"),
        (torch.zeros(2, 3), r"\(2, 3\)"),
        (np.array([0.1, 0.2]), "one number"),
    ],
    ids=["nan", "inf", "-inf", "tensor-nan", "np-nan", "str", "None", "True", "False",
         "tensor-2", "tensor-2x3", "ndarray-2"],
)
def test_bad_scores_raise_score_error(bad, match):
    ctl = controller(n_epochs_to_switch=2)
    ctl.step(1.0)
    with pytest.raises(ScoreError, match=match):
        ctl.step(bad)
    # nothing was recorded: the epoch count and the patience are unchanged
    assert ctl.epoch == 1 and len(ctl.state.history) == 1
    assert actions(feed(ctl, [1.0, 1.0])) == [C, R]


def test_bad_test_score_raises_score_error():
    ctl = controller()
    with pytest.raises(ScoreError, match="test score"):
        ctl.step(1.0, test_score=float("nan"))
    assert ctl.epoch == 0


@pytest.mark.parametrize(
    "good, value",
    [
        (torch.tensor(0.25), 0.25),
        (torch.tensor(0.25, requires_grad=True) * 1, 0.25),
        (torch.tensor([0.25]), 0.25),
        (np.float32(0.25), 0.25),
        (np.float64(0.25), 0.25),
        (np.int64(3), 3.0),
        (np.array(0.25), 0.25),
        (3, 3.0),
    ],
    ids=["tensor0d", "tensor-grad", "tensor-1", "np32", "np64", "npint", "ndarray0d", "int"],
)
def test_scalar_scores_are_accepted(good, value):
    ctl = controller()
    d = ctl.step(good)
    assert d.action == C
    assert ctl.best_score == pytest.approx(value)
    assert isinstance(ctl.best_score, float)


def test_step_after_completion_is_an_order_error():
    ctl = controller(switch_mode="never", n_epochs_to_switch=1)
    assert actions(feed(ctl, [1.0, 1.0])) == [C, DONE]
    with pytest.raises(OrderError, match="complete"):
        ctl.step(2.0)
    assert ctl.epoch == 2


def test_build_optimizer_before_set_optimizer_is_an_order_error():
    ctl = controller()
    with pytest.raises(OrderError, match="set_optimizer"):
        ctl.build_optimizer()


@pytest.mark.parametrize(
    "wrong, right",
    [("n_epoch_to_switch", "n_epochs_to_switch"), ("max_dendrite", "max_dendrites"),
     ("maximise", "maximize"), ("history_look_back", "history_lookback")],
)
def test_unknown_setting_names_suggest_the_nearest(wrong, right):
    with pytest.raises(ConfigError, match=right):
        controller(**{wrong: 3})
    with pytest.raises(ConfigError, match=right):
        PerforaConfig.from_dict({wrong: 3})
    with pytest.raises(ConfigError, match=wrong):
        PerforaConfig().replace(**{wrong: 3})


@pytest.mark.parametrize(
    "name, value",
    [
        ("n_epochs_to_switch", -1),
        ("n_epochs_to_switch", 0),
        ("max_dendrite_tries", 0),
        ("max_dendrites", -1),
        ("history_lookback", 0),
        ("fixed_switch_num", 0),
        ("improvement_threshold", -0.1),
        ("improvement_threshold_raw", math.nan),
        ("switch_mode", "sometimes"),
        ("activation", "softplus"),
        ("maximize", "yes"),
        ("n_epochs_to_switch", 2.5),
    ],
)
def test_out_of_range_settings_raise_config_error(name, value):
    with pytest.raises(ConfigError, match=name):
        controller(**{name: value})
    with pytest.raises(ConfigError, match=name):
        PerforaConfig(**{name: value})


def test_bad_choice_message_lists_a_valid_choice():
    with pytest.raises(ConfigError, match="patience|fixed|every_epoch|never"):
        PerforaConfig(switch_mode="patient")
    with pytest.raises(ConfigError, match="sigmoid|tanh|relu"):
        PerforaConfig(activation="sigmod")


def test_controller_on_unperforated_model_is_a_conversion_error():
    with pytest.raises(ConversionError, match="perforate"):
        GrowthController(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))


# --------------------------------------------------------------------------- restore_best
def test_restore_best_ends_a_loop_with_the_best_model_not_the_last():
    """A loop whose epochs run out before completion: the best model, public call."""
    ctl = controller(n_epochs_to_switch=2, max_dendrites=3, max_dendrite_tries=1)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    with pytest.raises(OrderError, match="no best model yet"):
        ctl.restore_best()
    feed(ctl, [0.5, 0.9])
    best = snapshot(ctl.model)
    with torch.no_grad():
        best_out = ctl.model(X)
    perturb(ctl.model)
    ds = feed(ctl, [0.8, 0.8, 0.7])  # a growth step, then worse: the loop ends here
    assert actions(ds) == [C, R, C] and not ctl.completed
    assert layer_counts(ctl.model) == {1}
    perturb(ctl.model)
    model = ctl.restore_best()
    assert model is ctl.model and layer_counts(model) == {0} and ctl.num_dendrites == 0
    assert_state_equal(model, best)
    with torch.no_grad():
        assert torch.equal(model(X), best_out)
    held = {id(p) for g in ctl.optimizer.param_groups for p in g["params"]}
    assert {id(p) for p in model.parameters() if p.requires_grad} <= held
