"""The growth history says what was grown and what a rewind undid: metrics.csv's ``grown`` and
``rewound_to`` columns, and the marks history.png draws from them."""

from __future__ import annotations

import matplotlib.image
import pytest
import torch
from torch import nn

import perfora
from perfora.errors import CheckpointError
from perfora.growth.history_marks import GrowthMark, HistoryMarks, describe_growth, history_marks
from perfora.growth.report import read_metrics

X = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] * X[:, 1] > 0).long() + (X[:, 2] > 0.5).long()


def _auto_run(run_dir, scores, **settings) -> perfora.GrowthController:
    """A controller grown at every epoch on ``scores``, writing its run files."""
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)))
    ctl = perfora.GrowthController(model, growth="auto", switch_mode="every_epoch",
                                   max_dendrites=3, max_neuron_steps=3, run_dir=run_dir,
                                   save_checkpoints=False, **settings)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    for score in scores:
        model.train()
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), Y).backward()
        opt.step()
        decision = ctl.step(score)
        model, opt = decision.model, decision.optimizer
        if decision.complete:
            break
    return ctl


def test_each_restructure_names_its_kind_and_the_epoch_it_went_back_to(tmp_path):
    # higher is better: dendrites pay (epoch 2), fail (3); neurons pay (4), fail (5);
    # dendrites fail too (6) -> complete on the best model (epoch 4)
    ctl = _auto_run(tmp_path, (0.5, 0.6, 0.55, 0.7, 0.65, 0.6), maximize=True)
    assert ctl.completed
    rows = ctl.state.history
    assert [r.get("grown") for r in rows] == ["dendrites", "dendrites", "neurons", "neurons",
                                              "dendrites", None]
    # auto grows every step on the best model; a failed step's cycle goes back before it
    assert [r.get("rewound_to") for r in rows] == [1, 2, 2, 4, 4, 4]
    # metrics.csv holds the same cells, read back as the controller recorded them
    written = read_metrics(tmp_path / "metrics.csv")
    assert [r.get("grown") for r in written] == [r.get("grown") for r in rows]
    assert [r.get("rewound_to") for r in written] == [1, 2, 2, 4, 4, 4]


def test_the_plot_marks_each_step_by_kind_and_the_steps_a_rewind_undid(tmp_path):
    ctl = _auto_run(tmp_path, (0.5, 0.6, 0.55, 0.7, 0.65, 0.6), maximize=True)
    marks = history_marks(ctl.state.history, ctl.state.switch_epochs)
    assert marks.steps == [GrowthMark(1, "dendrites", False), GrowthMark(2, "dendrites", True),
                           GrowthMark(3, "neurons", False), GrowthMark(4, "neurons", True),
                           GrowthMark(5, "dendrites", True)]
    assert marks.undone_spans == [(2, 3), (4, 5), (4, 6)]
    assert matplotlib.image.imread(tmp_path / "history.png").ndim == 3
    # the marks read back from metrics.csv are the same (the plot of a resumed run)
    assert history_marks(read_metrics(tmp_path / "metrics.csv"),
                         ctl.state.switch_epochs) == marks


def test_rows_without_the_columns_take_the_kind_from_their_reason():
    history = [{"epoch": 3, "reason": "plateau: added dendrite set 1"},
               {"epoch": 7, "reason": "plateau: added neuron step 1 (0: +4 random)"},
               {"epoch": 9, "reason": ""}]
    marks = history_marks(history, [3, 7])
    assert marks.steps == [GrowthMark(3, "dendrites", False), GrowthMark(7, "neurons", False)]
    assert marks.undone_spans == []


def test_dendrite_growth_that_keeps_failed_sets_marks_them_undone_at_completion():
    # growth='dendrites' keeps a set that fails and grows on (retain_all_dendrites); the
    # completion goes back to the best model, before the sets that did not pay
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)))
    ctl = perfora.GrowthController(model, growth="dendrites", switch_mode="every_epoch",
                                   max_dendrites=3, maximize=True, write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    ctl.build_optimizer()
    for score in (0.5, 0.6, 0.55, 0.54, 0.53):
        decision = ctl.step(score)
        if decision.complete:
            break
    assert ctl.completed
    marks = history_marks(ctl.state.history, ctl.state.switch_epochs)
    assert [(m.epoch, m.kind, m.undone) for m in marks.steps] == [
        (1, "dendrites", False), (2, "dendrites", True), (3, "dendrites", True)]
    assert marks.undone_spans == [(2, 4)]


def test_the_state_records_each_step_s_kind_growth_on_request_included(tmp_path):
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)))
    ctl = perfora.GrowthController(model, growth="dendrites", run_dir=tmp_path,
                                   save_checkpoints=False)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    ctl.build_optimizer()
    ctl.step(0.5)
    ctl.add_neurons()  # on request: no history row of its own
    ctl.add_dendrites()
    ctl.step(0.4)
    assert ctl.state.switch_epochs == [1, 1]
    assert ctl.state.growth_kinds == ["neurons", "dendrites"]
    marks = history_marks(ctl.state.history, ctl.state.switch_epochs, ctl.state.growth_kinds)
    assert [(m.epoch, m.kind) for m in marks.steps] == [(1, "neurons"), (1, "dendrites")]
    # the kinds travel in the controller's state (checkpoints, resume)
    saved = ctl.state_dict()
    assert saved["controller"]["growth_kinds"] == ["neurons", "dendrites"]


def test_a_state_saved_before_the_kinds_were_recorded_still_loads_and_plots(tmp_path):
    ctl = _auto_run(tmp_path, (0.5, 0.6, 0.55), maximize=True)
    assert ctl.state.growth_kinds == ["dendrites", "dendrites", "neurons"]
    saved = ctl.state_dict()
    del saved["controller"]["growth_kinds"]  # as an older version wrote it
    again = _auto_run(tmp_path / "again", (), maximize=True)
    again.load_state(saved)
    assert again.state.growth_kinds == []
    # the plot then reads each step's kind from its history row
    marks = history_marks(again.state.history, again.state.switch_epochs,
                          again.state.growth_kinds)
    assert [m.kind for m in marks.steps] == ["dendrites", "dendrites", "neurons"]


@pytest.mark.parametrize("field, bad, where", [
    ("growth_kinds", ["branches"], r"controller.growth_kinds\[0\]"),
    ("history_rewound_to", "epoch three", r"controller.history\[0\]\['rewound_to'\]"),
    ("history_grown", 7, r"controller.history\[0\]\['grown'\]")])
def test_a_saved_growth_record_that_is_not_one_is_refused(tmp_path, field, bad, where):
    ctl = _auto_run(tmp_path, (0.5,), maximize=True)
    saved = ctl.state_dict()
    if field == "growth_kinds":
        saved["controller"]["growth_kinds"] = bad
    else:
        saved["controller"]["history"][0][field.removeprefix("history_")] = bad
    with pytest.raises(CheckpointError, match=where):
        ctl.load_state(saved)


def test_the_growth_kept_is_told_in_order_with_the_steps_undone(tmp_path):
    ctl = _auto_run(tmp_path, (0.5, 0.6, 0.55, 0.7, 0.65, 0.6), maximize=True)
    marks = history_marks(ctl.state.history, ctl.state.switch_epochs, ctl.state.growth_kinds)
    # the model it returns holds 1 set and 1 neuron step; 3 steps did not pay
    assert (ctl.num_dendrites, ctl.state.num_widenings) == (1, 1)
    assert describe_growth(marks) == ("1 dendrite set, then 1 neuron step; 3 steps undone "
                                      "(they did not beat the best score)")
    steps = [GrowthMark(1, "dendrites", False), GrowthMark(2, "dendrites", False),
             GrowthMark(3, "neurons", False), GrowthMark(4, "neurons", True)]
    assert describe_growth(HistoryMarks(steps, [])) == (
        "2 dendrite sets, then 1 neuron step; 1 step undone (it did not beat the best score)")
    assert describe_growth(HistoryMarks([], [])) == (
        "nothing kept (the start network scored best)")
