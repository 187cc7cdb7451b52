"""growth='neurons': the controller widens wrapped layers at a plateau, exactly; the new
neurons' incoming weights come from the recorded error (GradMax) or the layer's own init; the
optimizer carries its moments and schedule on; the rewind shrinks back; a resumed run equals
an uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import perfora
from perfora.errors import ConfigError, PerforationError
from perfora.growth.history_marks import history_marks
from perfora.nn.widening import gradmax_rows

X = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] * X[:, 1] > 0).long() + (X[:, 2] > 0.5).long()


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return perfora.perforate(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 5),
                                           nn.ReLU(), nn.Linear(5, 3)))


def _controller(model: nn.Module, **settings) -> perfora.GrowthController:
    base = dict(growth="neurons", switch_mode="every_epoch", max_neuron_steps=2,
                write_files=False)
    ctl = perfora.GrowthController(model, **{**base, **settings})
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    ctl.build_optimizer()
    return ctl


def _epoch(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 4, x: torch.Tensor = X,
           y: torch.Tensor = Y) -> None:
    model.train()
    for i in range(steps):
        opt.zero_grad()
        rows = slice(16 * i, 16 * i + 16)
        nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
        opt.step()
    model.eval()


IMAGES = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def _normed_cnn(seed: int = 0) -> nn.Module:
    """Widened pairs through a GroupNorm (groups of 2) and an InstanceNorm with statistics."""
    torch.manual_seed(seed)
    return perfora.perforate(nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.SiLU(), nn.Conv2d(4, 4, 3),
        nn.InstanceNorm2d(4, affine=True, track_running_stats=True), nn.ReLU(),
        nn.Flatten(), nn.Linear(4 * 36, 3)))


MODELS = {"mlp": (_model, _epoch),
          "normed-cnn": (_normed_cnn, lambda model, opt: _epoch(model, opt, x=IMAGES))}


def test_each_step_widens_every_layer_that_can_grow_and_keeps_the_output():
    model = _model()
    ctl = _controller(model, neuron_init="random", neurons_per_step=0.5)
    opt = ctl.optimizer
    for step in (1, 2):
        _epoch(model, opt)
        with torch.no_grad():
            before = model(X)
        decision = ctl.step(0.5)
        assert decision.restructured, decision.reason
        with torch.no_grad():
            assert torch.equal(model(X), before)
        model, opt = decision.model, decision.optimizer
        assert model[0].num_neurons == 4 + 2 * step and model[2].num_neurons == 5 + 3 * step
        assert model[4].num_neurons == 3  # its output leaves the model: never widened
        assert f"added neuron step {step} (0: +2 random, 2: +3 random)" in decision.reason
    assert ctl.state.num_widenings == 2


def test_gradmax_rows_are_the_top_directions_of_the_recorded_error():
    model = _model()
    ctl = _controller(model, max_neuron_steps=1, neurons_per_step=1.0, neuron_init="gradmax")
    # M for layer 0 = sum over rows of (gradient at its reader's output)^T (its input), from
    # the one training batch of the epoch, before the optimizer step
    kept = {}
    handle = model[2].register_forward_hook(lambda m, a, out: kept.update(out=out))
    out = model(X[:16])
    handle.remove()
    kept["out"].retain_grad()
    nn.functional.cross_entropy(out, Y[:16]).backward()
    want = kept["out"].grad.double().T @ X[:16].double() / 16
    model.zero_grad()
    _epoch(model, ctl.optimizer, steps=1)
    scale = float(model[0].source.weight.detach().norm(dim=1).mean())
    decision = ctl.step(0.5)
    assert "0: +4 gradmax" in decision.reason and "2: +5 gradmax" in decision.reason
    new_rows = decision.model[0].source.weight[4:].detach().double()
    expected = gradmax_rows(want, 4, scale)
    cosines = (new_rows * expected).sum(1) / (new_rows.norm(dim=1) * expected.norm(dim=1))
    assert torch.allclose(cosines.abs(), torch.ones(4, dtype=torch.float64), atol=1e-4)
    assert torch.allclose(new_rows.norm(dim=1), torch.full((4,), scale, dtype=torch.float64),
                          rtol=1e-5)
    new_columns = decision.model[2].source.weight[:, 4:]  # layer 2's 5 + 5 rows read them
    assert new_columns.shape == (10, 4) and not new_columns.any()


def _stepped_by_steplr() -> tuple[nn.Module, perfora.GrowthController, torch.optim.Optimizer]:
    """A model, a controller that adds one neuron step at the third score, and the Adam it
    built, with a StepLR (halving every epoch) registered."""
    model = _model()
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="fixed",
                                   fixed_switch_num=3, max_neuron_steps=1, write_files=False,
                                   neuron_init="random")
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    ctl.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    opt, _ = ctl.build_optimizer()
    return model, ctl, opt


def test_the_optimizer_carries_its_moments_and_learning_rate_on():
    model, ctl, opt = _stepped_by_steplr()
    for _ in range(2):
        _epoch(model, opt)
        assert not ctl.step(0.5).restructured
    _epoch(model, opt)
    old = {name: dict(opt.state[p]) for name, p in model.named_parameters()}
    lr = opt.param_groups[0]["lr"]
    decision = ctl.step(0.5)
    assert decision.restructured and decision.optimizer is not opt
    new_opt = decision.optimizer
    assert new_opt.param_groups[0]["lr"] == lr == 0.01 * 0.5 ** 2  # the schedule went on
    assert decision.scheduler.last_epoch == 2
    for name, p in decision.model.named_parameters():
        state, before = new_opt.state[p], old[name]
        assert torch.equal(state["step"], before["step"]), name
        for key in ("exp_avg", "exp_avg_sq"):
            old_slice = tuple(slice(0, n) for n in before[key].shape)
            assert torch.equal(state[key][old_slice], before[key]), (name, key)
            rest = state[key].clone()
            rest[old_slice] = 0
            assert not rest.any(), (name, key)  # new entries start at zero


def test_completion_rewinds_to_a_narrower_best_model():
    model = _model()
    ctl = _controller(model, neuron_init="random", max_neuron_steps=2)
    opt = ctl.optimizer
    _epoch(model, opt)
    with torch.no_grad():
        best_out = model(X)
    best = {k: v.clone() for k, v in model.state_dict().items()}
    scores = iter([0.9, 0.5, 0.4])  # the first model stays the best
    for _ in range(3):
        decision = ctl.step(next(scores))
        model, opt = decision.model, decision.optimizer
        if decision.complete:
            break
        _epoch(model, opt)
    assert decision.complete and "max_neuron_steps=2" in decision.reason
    assert model[0].num_neurons == 4 and model[2].base.in_features == 4
    assert {k: v.shape for k, v in model.state_dict().items()} == \
        {k: v.shape for k, v in best.items()}
    with torch.no_grad():
        assert torch.equal(model(X), best_out)
    assert ctl.state.num_widenings == 0


AUTO_SCORES = (0.5, 0.51, 0.52, 0.53, 0.52, 0.51, 0.6, 0.61)
"""Per epoch, with a growth step every 2 epochs: dendrite sets 1 and 2 pay, the next fails
(undone: neuron step 1 instead), which pays: neuron step 2."""


def _train_run(tmp_path: Path, stop_after: int | None = None, resume_from: Path | None = None,
               growth: str = "neurons", kind: str = "mlp") -> perfora.GrowthController:
    settings = dict(growth=growth, switch_mode="fixed", fixed_switch_num=2,
                    max_neuron_steps=2, seed=3, checkpoint_time_budget=None)
    build, epoch = MODELS[kind]
    if resume_from is None:
        ctl = perfora.GrowthController(build(), run_dir=tmp_path, **settings)
        ctl.set_optimizer(torch.optim.Adam, lr=0.01)
        ctl.build_optimizer()
    else:
        ctl = perfora.resume(build(), resume_from, optimizer=torch.optim.Adam,
                             optimizer_args={"lr": 0.01})
    model, opt = ctl.model, ctl.optimizer
    torch.manual_seed(ctl.epoch)
    while not ctl.completed and ctl.epoch < (8 if growth == "auto" else 6):
        epoch(model, opt)
        decision = ctl.step(AUTO_SCORES[ctl.epoch] if growth == "auto"
                            else 0.5 + 0.01 * ctl.epoch)
        model, opt = decision.model, decision.optimizer
        if stop_after is not None and ctl.epoch == stop_after:
            break
    return ctl


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    whole = _train_run(tmp_path / "whole")
    _train_run(tmp_path / "cut", stop_after=3)  # after the first widening
    resumed = _train_run(tmp_path / "cut", resume_from=tmp_path / "cut" / "latest.safetensors")
    assert resumed.state.num_widenings == whole.state.num_widenings == 2
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_resumed_auto_run_equals_an_uninterrupted_one(tmp_path, kind):
    whole = _train_run(tmp_path / "whole", growth="auto", kind=kind)
    reasons = [row["reason"] for row in whole.state.history if row["reason"]]
    assert reasons[2].startswith("dendrite set 2 did not beat the best score: undone; added "
                                 "neuron step 1 instead")
    assert reasons[3].startswith("plateau: added neuron step 2")
    # cut after the undo: the resumed run must know that neurons are the kind that pays now
    _train_run(tmp_path / "cut", stop_after=7, growth="auto", kind=kind)
    resumed = _train_run(tmp_path / "cut", resume_from=tmp_path / "cut" / "latest.safetensors",
                         growth="auto", kind=kind)
    assert (resumed.state.num_dendrites, resumed.state.num_widenings) == \
        (whole.state.num_dendrites, whole.state.num_widenings) == (1, 2)
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # the resumed history (metrics.csv's rows before the cut, then its own) marks the same
    # steps, kinds and undone epochs as the whole run's, so its history.png does too
    assert resumed.state.growth_kinds == whole.state.growth_kinds
    marks = history_marks(whole.state.history, whole.state.switch_epochs)
    assert history_marks(resumed.state.history, resumed.state.switch_epochs) == marks
    assert history_marks(resumed.state.history, resumed.state.switch_epochs,
                         resumed.state.growth_kinds) == marks
    assert [s.kind for s in marks.steps] == ["dendrites", "dendrites", "neurons", "neurons"]
    assert [s.undone for s in marks.steps] == [False, True, False, False]
    if kind == "normed-cnn":  # the norms grew with their layers: 4 -> 12 channels
        assert reasons[3].endswith("(0: +4 random, 3: +4 random)")
        assert whole.model[1].num_groups == 6 and len(a["4.running_mean"]) == 12


def test_neuron_growth_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match="rule='gd'"):
        perfora.PerforaConfig(growth="neurons", rule="correlation")
    with pytest.raises(ConfigError, match="growth"):
        perfora.PerforaConfig(growth="width")
    with pytest.raises(ConfigError, match="neurons_per_step"):
        perfora.PerforaConfig(neurons_per_step=0)
    only_last = perfora.perforate(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)),
                                  paths=["2"])
    with pytest.raises(PerforationError, match="no wrapped layer can gain neurons.*2: "):
        perfora.GrowthController(only_last, growth="neurons", write_files=False)


def test_auto_says_when_it_can_grow_dendrites_only(recwarn):
    def only_last() -> nn.Module:
        return perfora.perforate(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)),
                                 paths=["2"])

    with pytest.warns(UserWarning, match=r"growth='auto' will grow dendrites only: no wrapped "
                                         r"layer can gain neurons \(2: its output is an output "
                                         r"of the model \(its width is the model's output "
                                         r"size\)\).*neuron_pairs="):
        ctl = perfora.GrowthController(only_last(), write_files=False)  # the default: auto
    assert ctl.config.max_neuron_steps == 0
    recwarn.clear()
    # nothing to say where dendrites are what was asked for, or neurons can grow
    perfora.GrowthController(only_last(), growth="dendrites", write_files=False)
    perfora.GrowthController(only_last(), max_neuron_steps=0, write_files=False)
    perfora.GrowthController(_model(), write_files=False)
    assert not [w for w in recwarn if "dendrites only" in str(w.message)]


class _Cumsum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.cumsum(self.fc1(x), -1))  # mixes the neurons: not followed


def test_the_warning_names_the_setting_neuron_pairs_not_the_planners_argument():
    model = perfora.perforate(_Cumsum(), paths=["fc1"])
    with pytest.warns(UserWarning, match="dendrites only") as said:
        perfora.GrowthController(model, write_files=False)
    message = str(said[0].message)
    assert "fc1: its output goes to cumsum (call_function)" in message
    assert "pass neuron_pairs=)" in message and " pairs=" not in message


def test_a_dataparallel_model_is_rewrapped_widened():
    model = _model()
    wrapped = nn.DataParallel(model)
    ctl = perfora.GrowthController(wrapped, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, write_files=False, neuron_init="random")
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    opt, _ = ctl.build_optimizer()
    _epoch(wrapped, opt)
    with torch.no_grad():
        before = wrapped(X)
    decision = ctl.step(0.5, model=wrapped)
    assert isinstance(decision.model, nn.DataParallel) and decision.model is not wrapped
    assert decision.model.module[0].num_neurons == 8
    with torch.no_grad():
        assert torch.equal(decision.model(X), before)
    _epoch(decision.model, decision.optimizer)  # the new wrapper trains the widened weights
    assert decision.model.module[2].source.weight[:, 4:].abs().sum() > 0


def _structure(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """(dendrite sets, width) of each wrapped layer."""
    return tuple((layer.num_dendrites, layer.num_neurons)
                 for layer in perfora.dendritic_layers(model).values())


def test_auto_keeps_the_kind_that_pays_and_undoes_the_one_that_does_not():
    model = _model()
    ctl = _controller(model, growth="auto", max_neuron_steps=3, max_dendrites=3)
    opt = ctl.optimizer
    reasons, shapes = [], []
    # scores: 1st cycle; dendrites pay; dendrites fail; neurons pay; neurons fail; dendrites
    # fail too -> complete
    for score in (0.5, 0.6, 0.55, 0.7, 0.65, 0.6):
        _epoch(model, opt)
        with torch.no_grad():
            before = model(X)
        decision = ctl.step(score)
        if not decision.complete:  # a step keeps the output (an undo restores the best first)
            assert decision.restructured, decision.reason
            if "undone" not in decision.reason:
                with torch.no_grad():
                    assert torch.equal(decision.model(X), before)
        model, opt = decision.model, decision.optimizer
        reasons.append(decision.reason)
        shapes.append(_structure(model))
    assert reasons[:2] == ["plateau: added dendrite set 1", "plateau: added dendrite set 2"]
    # GradMax rows (the default) from the error recorded in the epoch before each step; the
    # sums recorded on a structure that was undone since are dropped, not added to
    assert reasons[2] == ("dendrite set 2 did not beat the best score: undone; added neuron "
                          "step 1 instead (0: +4 gradmax, 2: +5 gradmax)")
    assert reasons[3] == "plateau: added neuron step 2 (0: +4 gradmax, 2: +5 gradmax)"
    assert reasons[4] == ("neuron step 2 did not beat the best score: undone; added "
                          "dendrite set 2 instead")
    assert decision.complete and reasons[5] == (
        "dendrite set 2 did not beat the best score, nor did the neuron step before it: "
        "growth stops here")
    assert shapes[0] == ((1, 4), (1, 5), (1, 3))
    assert shapes[1] == ((2, 4), (2, 5), (2, 3))
    # the failed 2nd set is undone; the hidden layers gain neurons (the last feeds no layer)
    assert shapes[2] == ((1, 8), (1, 10), (1, 3))
    assert shapes[3] == ((1, 12), (1, 15), (1, 3))
    assert shapes[4] == ((2, 8), (2, 10), (2, 3))
    assert shapes[5] == ((1, 8), (1, 10), (1, 3))  # completion restores the best (0.7)
    assert ctl.best_score == 0.7


@pytest.mark.parametrize("retain", [True, False])
def test_auto_grows_each_step_from_the_best_model_not_from_the_plateau(retain):
    # the epochs of plateau after the best are dropped: the grown model computes what the
    # best one did (growing on top of the plateau measured worse in benchmarks/quality.py)
    model = _model()
    ctl = _controller(model, growth="auto", switch_mode="patience", n_epochs_to_switch=2,
                      retain_all_dendrites=retain)
    opt = ctl.optimizer
    for epoch, score in enumerate((0.5, 0.4, 0.4)):
        _epoch(model, opt)
        with torch.no_grad():
            out = model(X)
        if epoch == 0:
            best = out
        decision = ctl.step(score)
        model, opt = decision.model, decision.optimizer
    assert decision.restructured and decision.reason == "plateau: added dendrite set 1"
    with torch.no_grad():
        assert not torch.equal(out, best)  # the plateau epochs trained on
        assert torch.equal(model(X), best)  # the set grew on the best model


def test_auto_switches_kind_when_one_reaches_its_cap():
    model = _model()
    ctl = _controller(model, growth="auto", max_neuron_steps=1, max_dendrites=1)
    opt = ctl.optimizer
    reasons = []
    for score in (0.5, 0.6, 0.7):  # every step pays
        _epoch(model, opt)
        decision = ctl.step(score)
        model, opt = decision.model, decision.optimizer
        reasons.append(decision.reason)
    assert [r.split(" (")[0] for r in reasons] == [
        "plateau: added dendrite set 1", "plateau: added neuron step 1",
        "reached max_dendrites=1 and max_neuron_steps=1"]
    assert decision.complete and _structure(model) == ((1, 8), (1, 10), (1, 3))


def test_auto_grows_dendrites_only_where_no_layer_can_gain_neurons():
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 3)))
    with pytest.warns(UserWarning, match="will grow dendrites only"):
        ctl = _controller(model, growth="auto", max_neuron_steps=2, max_dendrites=2)
    assert ctl.config.max_neuron_steps == 0
    reasons = [ctl.step(score).reason for score in (0.5, 0.6, 0.7)]
    assert reasons == ["plateau: added dendrite set 1", "plateau: added dendrite set 2",
                       "reached max_dendrites=2 and max_neuron_steps=0"]


def test_max_dendrites_zero_keeps_auto_the_early_stopping_baseline():
    ctl = _controller(_model(), growth="auto", max_dendrites=0, max_neuron_steps=3)
    decision = ctl.step(0.5)
    assert decision.complete and "early stopping" in decision.reason


def test_a_widened_state_loads_into_a_fresh_model_as_a_grown_dendrite_count_does():
    # as Lightning's ddp_spawn hands the workers' weights back to the launching process
    model = _model()
    ctl = _controller(model, growth="auto", max_dendrites=1, max_neuron_steps=2)
    opt = ctl.optimizer
    for score in (0.5, 0.6, 0.7):  # a dendrite set, then two neuron steps
        _epoch(model, opt)
        model, opt = ctl.step(score).model, ctl.optimizer
    assert _structure(model) == ((1, 12), (1, 15), (1, 3))
    fresh = _model(seed=1)
    fresh.load_state_dict(model.state_dict())
    assert _structure(fresh) == _structure(model)
    with torch.no_grad():
        assert torch.allclose(fresh(X), model(X), atol=1e-6)
    with pytest.raises(RuntimeError, match="size mismatch"):  # not only wider: the load says
        _model().load_state_dict({**_model().state_dict(),
                                  "0.base.weight": torch.zeros(12, 5)}, strict=False)


def test_add_neurons_widens_now_whatever_growth_says():
    model = _model()
    ctl = _controller(model, growth="dendrites")
    _epoch(model, ctl.optimizer)
    with torch.no_grad():
        before = model(X)
    decision = ctl.add_neurons()
    assert decision.reason == "added on request (0: +4 random, 2: +5 random)"
    model = decision.model
    with torch.no_grad():
        assert torch.equal(model(X), before)
    assert (model[0].num_neurons, model[2].num_neurons, ctl.num_dendrites) == (8, 10, 0)
    moments = decision.optimizer.state[model[0].base.weight]["exp_avg"]
    assert moments.shape == (8, 6) and not moments[4:].any() and moments[:4].any()
    only_last = perfora.perforate(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)),
                                  paths=["2"])
    ctl = perfora.GrowthController(only_last, growth="dendrites", write_files=False)
    with pytest.raises(PerforationError, match="no wrapped layer can gain neurons"):
        ctl.add_neurons()
    assert only_last[2].num_neurons == 3


def test_the_optimizer_you_register_after_a_neuron_step_gets_the_moments():
    model = _model()
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, write_files=False)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ctl.set_optimizer_instance(opt)
    _epoch(model, opt)
    old = opt.state[model[0].base.weight]["exp_avg"].clone()
    decision = ctl.step(0.5)
    assert decision.restructured and decision.optimizer is None  # yours to rebuild
    model = decision.model
    fresh = torch.optim.Adam(model.parameters(), lr=0.01)
    ctl.set_optimizer_instance(fresh)
    new = fresh.state[model[0].base.weight]["exp_avg"]
    assert torch.equal(new[:4], old) and not new[4:].any()
    assert not ctl.carry_optimizer_state(torch.optim.Adam(model.parameters()))  # only once


def test_a_frozen_layer_or_one_whose_reader_is_frozen_is_not_grown_and_the_reason_says_so():
    # a frozen reader would hold the new neurons' outgoing weights at zero for good; a frozen
    # layer is one the user keeps as it is (and widening it breaks the adapter file)
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 6),
                                            nn.Tanh(), nn.Linear(6, 6), nn.ReLU(),
                                            nn.Linear(6, 2)))
    model[2].requires_grad_(False)
    ctl = _controller(model, growth="neurons")
    assert ctl.add_neurons().reason == "added on request (4: +6 random)"
    assert (model[0].num_neurons, model[2].num_neurons) == (12, 6)
    lone = perfora.perforate(nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 2)))
    lone[0].requires_grad_(False)
    with pytest.raises(PerforationError, match=r"0: it is frozen \(requires_grad=False\): a "
                                               r"frozen layer keeps its width"):
        _controller(lone, growth="neurons")
    lone[0].requires_grad_(True)
    lone[2].requires_grad_(False)
    with pytest.raises(PerforationError, match=r"0: its reader 2 is frozen"):
        _controller(lone, growth="neurons")


def test_a_retried_neuron_step_starts_its_new_neurons_moments_at_zero():
    # the retry regrows the same shapes on the best model: the undone neurons' Adam moments
    # used to be copied into the fresh ones
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3)))
    ctl = _controller(model, switch_mode="patience", n_epochs_to_switch=1, max_neuron_steps=1,
                      retain_all_dendrites=False, max_dendrite_tries=2, neuron_init="random")
    opt = ctl.optimizer
    for score in (0.5, 0.4, 0.45, 0.3):  # a step at epoch 2 fails by epoch 4: undone, retried
        _epoch(model, opt)
        decision = ctl.step(score)
        model, opt = decision.model, decision.optimizer
    assert decision.reason.startswith("neuron step did not beat the best score; retry 1")
    state = opt.state[model[0].source.weight]
    assert model[0].num_neurons == 24
    assert state["exp_avg"][12:].abs().sum() == 0 and state["exp_avg_sq"][12:].sum() == 0
    assert state["exp_avg"][:12].abs().sum() > 0  # the old neurons keep theirs


def test_a_registered_schedule_carried_through_a_neuron_step_is_not_called_stepped_twice():
    # the new scheduler was marked at step 0, before the carried step count was loaded
    # into it, so the next score warned that the loop had stepped it as well
    import warnings

    model, ctl, opt = _stepped_by_steplr()
    grew = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            _epoch(model, opt)
            decision = ctl.step(0.5)
            grew.append(decision.restructured)
            model, opt = decision.model, decision.optimizer
    assert grew == [False, False, True, False, False]
    assert decision.scheduler.last_epoch == 4  # 2 before the step, 2 after (not its epoch)
    assert not [w for w in caught if "was stepped" in str(w.message)]
