"""DendriteGrowthCallback in real Hugging Face Trainer runs (CPU): growth in process with
exact outputs, a rebuilt optimizer and scheduler that keep their position, completion with
the best model, save_model and reload, a resumed run equal to an uninterrupted one, and
2 processes as torchrun starts them (ranks identical; the negative control without the new
wrapper diverges)."""

from __future__ import annotations

import copy
import shutil
import sys
import warnings
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from tests.support.paths import SCRIPTS  # noqa: E402

sys.path.insert(0, str(SCRIPTS / "trainers"))
from hf_tiny import Blobs, TinyClassifier, TinyConfig, digest, make_trainer  # noqa: E402

import perfora  # noqa: E402
from perfora.checkpoint.format import save_checkpoint  # noqa: E402
from perfora.integrations.transformers import (
    CONTROLLER_FILE,
    DendriteGrowthCallback,
    load_grown_pretrained,
)
from perfora.nn.perforation import layer_specs  # noqa: E402
from tests.support.two_ranks import run_two_ranks  # noqa: E402

# the tests here share module-scoped runs: keep them on one pytest-xdist worker
pytestmark = pytest.mark.xdist_group("test_hf_trainer")

SCRIPT = SCRIPTS / "trainers" / "train_hf_trainer.py"
EPOCHS = 30
PROBE = Blobs(32, 9).x


def _growth() -> DendriteGrowthCallback:
    return DendriteGrowthCallback(monitor="eval_accuracy", patience=2, max_dendrites=2, seed=0,
                                  dendrite_init="default", write_files=False,
                                  growth="dendrites")


class Probe(TrainerCallback):
    """Records, at every evaluation, the model's outputs on fixed inputs and the optimizer."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.rows: list[dict[str, Any]] = []

    def on_evaluate(self, args, state, control, **kwargs) -> None:
        trainer = self.trainer
        with torch.no_grad():
            out = trainer.model(PROBE).logits.clone()
        opt = trainer.optimizer
        held = {id(p) for g in opt.param_groups for p in g["params"]}
        self.rows.append({
            "out": out, "lr": [g["lr"] for g in opt.param_groups],
            "optimizer": opt, "scheduler_steps": trainer.lr_scheduler.last_epoch,
            "step": state.global_step,
            "covers": all(id(p) in held for p in trainer.model.parameters())})


@pytest.fixture(scope="module")
def grown(tmp_path_factory) -> dict[str, Any]:
    """One run that grows two sets and completes, with a checkpoint every epoch."""
    out = tmp_path_factory.mktemp("grown")
    trainer = make_trainer(str(out), epochs=EPOCHS, save=True)
    before, after = Probe(), Probe()
    before.trainer = after.trainer = trainer
    trainer.add_callback(before)  # runs before the growth callback, `after` after it
    growth = _growth().bind(trainer)
    trainer.add_callback(after)
    trainer.train()
    return {"trainer": trainer, "growth": growth, "before": before.rows,
            "after": after.rows, "out": out, "digest": digest(trainer.model)}


def test_grows_exactly_rebuilds_the_optimizer_and_stops_with_the_best(grown):
    trainer, ctl = grown["trainer"], grown["growth"].controller
    events = [row["event"] for row in ctl.state.history]
    assert events.count("restructure") == 2 and events[-1] == "complete"
    assert trainer.state.global_step < trainer.state.max_steps  # stopped early
    for row, pre, post in zip(ctl.state.history, grown["before"], grown["after"],
                              strict=True):
        if row["event"] != "restructure":
            continue
        assert torch.equal(pre["out"], post["out"])  # the new dendrites change nothing yet
        assert post["optimizer"] is not pre["optimizer"] and post["covers"]
        assert post["lr"] == pre["lr"]  # the schedule goes on where it was
        assert post["scheduler_steps"] == pre["scheduler_steps"] == pre["step"]
    assert grown["after"][-1]["covers"]  # rebuilt after the completion's rewind too
    # every evaluation logs the model's size after its step (each row's dendrite count is
    # the one the step before left), ending on the best model's
    logged = [row for row in trainer.state.log_history if "perfora/dendrites" in row]
    history = ctl.state.history
    after_each = [float(row["dendrites"]) for row in history[1:]] + [float(ctl.num_dendrites)]
    assert [row["perfora/dendrites"] for row in logged] == after_each and max(after_each) == 2
    assert logged[-1]["perfora/params"] == ctl.parameter_count()
    assert {row["perfora/neuron_steps"] for row in logged} == {0.0}  # growth="dendrites"
    # completion restored the best model: its weights and its score
    structure, best = ctl.best_snapshot
    state = trainer.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in best.items())
    epochs = ctl.epoch
    assert trainer.evaluate()["eval_accuracy"] == ctl.best_score
    assert ctl.epoch == epochs  # an evaluation outside train() is not a growth step


def test_save_model_and_reload_a_grown_model(grown, tmp_path):
    trainer = grown["trainer"]
    original = trainer.model
    had = original.head.num_dendrites
    model = copy.deepcopy(original)
    model.head.grow(torch.Generator().manual_seed(3))  # one more set, with real weights
    with torch.no_grad():
        model.head.out_weight.normal_()
    trainer.model = model
    try:
        trainer.save_model(str(tmp_path))
    finally:
        trainer.model = original
    assert (tmp_path / "model.safetensors").is_file()
    fresh = load_grown_pretrained(TinyClassifier(TinyConfig()), tmp_path)
    counts = {k: v.num_dendrites for k, v in perfora.dendritic_layers(fresh).items()}
    assert counts == {k: v.num_dendrites for k, v in perfora.dendritic_layers(model).items()}
    assert counts["head"] == had + 1
    with torch.no_grad():
        assert torch.equal(fresh(PROBE).logits, model(PROBE).logits)


@pytest.mark.parametrize("after_growth", [0, 1])
def test_resume_equals_the_uninterrupted_run(grown, tmp_path, after_growth):
    """Resume from the checkpoint written at the first growth step (an empty new
    optimizer) or one epoch later (Adam moments of the grown model)."""
    ctl = grown["growth"].controller
    epoch = ctl.state.switch_epochs[0] + after_growth
    step = grown["before"][epoch - 1]["step"]
    folder = grown["out"] / f"checkpoint-{step}"
    assert (folder / CONTROLLER_FILE).is_file()
    trainer = make_trainer(str(tmp_path), epochs=EPOCHS, save=True)
    growth = _growth().bind(trainer)
    trainer.train(resume_from_checkpoint=str(folder))
    assert [r["event"] for r in growth.controller.state.history] == \
        [r["event"] for r in ctl.state.history]
    assert growth.controller.state.history[-1]["val_score"] == \
        ctl.state.history[-1]["val_score"]
    assert digest(trainer.model) == grown["digest"]


def test_monitor_defaults_follow_the_trainer_and_a_missing_one_is_refused(tmp_path):
    trainer = make_trainer(str(tmp_path), epochs=1, metric_for_best_model="accuracy")
    growth = DendriteGrowthCallback().bind(trainer)
    assert (growth.monitor, growth.mode) == ("eval_accuracy", "max")
    plain = DendriteGrowthCallback().bind(make_trainer(str(tmp_path), epochs=1))
    assert (plain.monitor, plain.mode) == ("eval_loss", "min")
    missing = make_trainer(str(tmp_path), epochs=1)
    DendriteGrowthCallback(monitor="eval_f1").bind(missing)
    # one epoch: refused at the end of training, after its run files are written
    with pytest.raises(perfora.ConfigError, match=r"eval_f1.*'eval_accuracy', 'eval_loss'"):
        missing.train()


def test_an_early_stopping_callback_as_patient_as_growth_warns(tmp_path):
    from transformers import EarlyStoppingCallback

    stops = make_trainer(str(tmp_path), epochs=1, metric_for_best_model="accuracy")
    stops.add_callback(EarlyStoppingCallback(early_stopping_patience=3))
    DendriteGrowthCallback(patience=3, write_files=False).bind(stops)
    with pytest.warns(UserWarning, match=r"early_stopping_patience=3\) stops.*patience 3"):
        stops.train()
    waits = make_trainer(str(tmp_path), epochs=1, metric_for_best_model="accuracy")
    waits.add_callback(EarlyStoppingCallback(early_stopping_patience=8))
    DendriteGrowthCallback(patience=3, write_files=False).bind(waits)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        waits.train()
    assert not [w for w in record if "EarlyStoppingCallback" in str(w.message)]


def test_clear_errors_for_setups_it_cannot_grow(tmp_path):
    unbound = make_trainer(str(tmp_path), epochs=1)
    unbound.add_callback(DendriteGrowthCallback())
    with pytest.raises(perfora.OrderError, match=r"growth.bind\(trainer\)"):
        unbound.train()
    model = TinyClassifier(TinyConfig())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    given = make_trainer(str(tmp_path), epochs=1)
    given.optimizer = opt  # as Trainer(optimizers=(opt, None)) sets it
    with pytest.raises(perfora.ConfigError, match="optimizer_cls_and_kwargs"):
        DendriteGrowthCallback().bind(given)
    with pytest.raises(perfora.ConfigError, match="children"):
        DendriteGrowthCallback(module="body").bind(make_trainer(str(tmp_path), epochs=1))
    best_at_end = make_trainer(str(tmp_path), epochs=1)
    best_at_end.args.load_best_model_at_end = True
    with pytest.raises(perfora.ConfigError, match="load_best_model_at_end"):
        DendriteGrowthCallback().bind(best_at_end)
    no_eval = make_trainer(str(tmp_path), epochs=1)
    no_eval.args.eval_strategy = "no"
    before = _frozen(no_eval.model)
    with pytest.raises(perfora.ConfigError, match=r"eval_strategy=\"epoch\".*metric_for_best"):
        DendriteGrowthCallback().bind(no_eval)
    _assert_unchanged(no_eval.model, before)  # not even perforated
    rebuilt = make_trainer(str(tmp_path), epochs=1)
    rebuilt.model_init = lambda *trial: TinyClassifier(TinyConfig())  # as Trainer sets it
    before = _frozen(rebuilt.model)
    with pytest.raises(perfora.ConfigError, match=r"model_init.*Trainer\(model=model_init\(\)\)"):
        DendriteGrowthCallback().bind(rebuilt)
    _assert_unchanged(rebuilt.model, before)
    twice = make_trainer(str(tmp_path), epochs=1)
    first = DendriteGrowthCallback().bind(twice)
    with pytest.raises(perfora.OrderError, match="already has a bound DendriteGrowthCallback"):
        DendriteGrowthCallback().bind(twice)
    assert [c for c in twice.callback_handler.callbacks
            if isinstance(c, DendriteGrowthCallback)] == [first]


@pytest.mark.parametrize("restore", [True, False])
def test_a_run_that_ends_before_completion_ends_with_the_best_model(tmp_path, restore,
                                                                     capsys):
    """6 epochs: one growth step, no completion; the last score is below the best."""
    trainer = make_trainer(str(tmp_path), epochs=6)
    growth = DendriteGrowthCallback(monitor="eval_accuracy", patience=2, max_dendrites=2,
                                    seed=0, dendrite_init="default", write_files=False,
                                    restore_best_at_end=restore).bind(trainer)
    trainer.train()
    ctl = growth.controller
    assert not ctl.completed and "restructure" in [r["event"] for r in ctl.state.history]
    last = ctl.state.history[-1]["val_score"]
    assert last < ctl.best_score
    said = capsys.readouterr().out
    score = trainer.evaluate()["eval_accuracy"]
    if not restore:
        assert score == last and trainer.model.head.num_dendrites == 1
        assert "restored the best model" not in said
        return
    assert score == ctl.best_score
    # the swap was silent: the model returned had fewer parameters than the last log said
    assert (f"DendriteGrowthCallback: end of training: restored the best model (epoch "
            f"{ctl.state.best_epoch} of the run, eval_accuracy {ctl.best_score:g}, "
            f"{ctl.parameter_count()} parameters, 0 dendrite set(s))") in said
    structure, best = ctl.best_snapshot
    state = trainer.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in best.items())
    assert trainer.model.head.num_dendrites == structure["head"]["num_dendrites"] == 0
    held = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert all(id(p) in held for p in trainer.model.parameters())


def test_log_metrics_and_verbose_false_leave_the_trainer_s_log_to_it(tmp_path, capsys):
    trainer = make_trainer(str(tmp_path), epochs=2)
    growth = DendriteGrowthCallback(monitor="eval_accuracy", write_files=False,
                                    switch_mode="fixed", fixed_switch_num=1, log_metrics=False,
                                    verbose=False).bind(trainer)
    trainer.train()
    assert "restructure" in [row["event"] for row in growth.controller.state.history]
    rows = trainer.state.log_history
    assert sum("eval_accuracy" in row for row in rows) == 2
    assert not any(key.startswith("perfora/") for row in rows for key in row)
    assert "DendriteGrowthCallback:" not in capsys.readouterr().out  # it grew, silently


def _frozen(model) -> tuple[dict, dict]:
    return ({k: v.clone() for k, v in model.state_dict().items()}, layer_specs(model))


def _assert_unchanged(model, before) -> None:
    tensors, specs = before
    state = model.state_dict()
    assert state.keys() == tensors.keys()
    assert all(torch.equal(state[k], v) for k, v in tensors.items())
    assert layer_specs(model) == specs


@pytest.mark.parametrize("controller_from", ["later", "earlier"])
def test_a_controller_file_from_another_point_of_the_run_is_refused(grown, tmp_path,
                                                                    controller_from):
    """The weights of one checkpoint with the controller file of another, across a growth
    step: refused before the model (or anything else) changes."""
    ctl = grown["growth"].controller
    switch = ctl.state.switch_epochs[0]
    pre, post = (grown["out"] / f"checkpoint-{grown['before'][e - 1]['step']}"
                 for e in (switch - 1, switch + 1))
    weights, controller = (pre, post) if controller_from == "later" else (post, pre)
    folder = tmp_path / "checkpoint-crossed"
    shutil.copytree(weights, folder)
    shutil.copy(controller / CONTROLLER_FILE, folder / CONTROLLER_FILE)
    trainer = make_trainer(str(tmp_path / "out"), epochs=EPOCHS, save=True)
    growth = _growth().bind(trainer)
    if controller_from == "earlier":  # resume into a model that has grown already
        growth.restore(post)
    before = _frozen(trainer.model)
    history = list(growth.controller.state.history)
    with pytest.raises(perfora.CheckpointError, match="different points of the run"):
        trainer.train(resume_from_checkpoint=str(folder))
    _assert_unchanged(trainer.model, before)
    assert growth.controller.state.history == history




@pytest.mark.timeout(300)
def test_ddp_ranks_identical_after_growth_and_diverge_without_the_new_wrapper(tmp_path,
                                                                             script_server):
    ranks = run_two_ranks(script_server, SCRIPT, tmp_path / "good")
    assert ranks[0]["actions"].count("restructure") == 2 and ranks[0]["dendrites"] == 2
    assert ranks[0]["actions"] == ranks[1]["actions"]
    assert ranks[0]["digest"] == ranks[1]["digest"]  # every tensor, bit for bit
    assert ranks[0]["ddp"] and ranks[0]["ddp_covers_model"]
    assert ranks[0]["models_held"] == ranks[0]["optimizers_held"] == 1
    # the first wrapper kept: the ranks diverge
    control = run_two_ranks(script_server, SCRIPT, tmp_path / "stale", "--stale")
    assert control[0]["actions"].count("restructure") == 2
    assert not control[0]["ddp_covers_model"]
    assert control[0]["digest"] != control[1]["digest"]


@pytest.mark.timeout(300)
def test_ddp_grows_neurons_with_ranks_identical(tmp_path, script_server):
    ranks = run_two_ranks(script_server, SCRIPT, tmp_path / "good", "--growth", "neurons")
    assert ranks[0]["actions"].count("restructure") == 2 and ranks[0]["widenings"] == 2
    assert ranks[0]["actions"] == ranks[1]["actions"]
    assert ranks[0]["digest"] == ranks[1]["digest"]  # every tensor, bit for bit
    assert ranks[0]["ddp"] and ranks[0]["ddp_covers_model"]


def test_a_controller_file_whose_best_snapshot_does_not_fit_changes_nothing(grown, tmp_path):
    ctl = grown["growth"].controller
    step = grown["before"][ctl.state.switch_epochs[0]]["step"]  # after the growth step
    folder = tmp_path / "checkpoint-bad"
    shutil.copytree(grown["out"] / f"checkpoint-{step}", folder)
    saved = perfora.load_checkpoint(folder / CONTROLLER_FILE)
    saved.tensors["best"]["head.base.weight"] = saved.tensors["best"]["head.base.weight"][:2]
    save_checkpoint(folder / CONTROLLER_FILE, saved)
    trainer = make_trainer(str(tmp_path / "out"), epochs=EPOCHS, save=True)
    growth = _growth().bind(trainer)
    before = _frozen(trainer.model)
    with pytest.raises(perfora.CheckpointError, match="best snapshot"):
        trainer.train(resume_from_checkpoint=str(folder))
    _assert_unchanged(trainer.model, before)
    assert growth.controller.epoch == 0


def test_a_model_that_gained_neurons_reloads_from_save_pretrained(tmp_path):
    torch.manual_seed(0)
    model = perfora.perforate(TinyClassifier(TinyConfig()))
    perfora.widen(model, "encoder.0", 3)
    perfora.widen(model, "encoder.0", 2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # every weight, the new ones too, non-zero
    model.eval().save_pretrained(str(tmp_path))
    fresh = load_grown_pretrained(TinyClassifier(TinyConfig()), tmp_path).eval()
    assert fresh.encoder[0].num_neurons == model.encoder[0].num_neurons
    assert fresh.encoder[2].base.weight.shape == model.encoder[2].base.weight.shape
    with torch.no_grad():
        assert torch.allclose(fresh(PROBE).logits, model(PROBE).logits, atol=1e-6)


def test_a_neuron_step_carries_the_moments_into_the_trainers_new_optimizer(tmp_path, capsys):
    trainer = make_trainer(str(tmp_path / "out"), epochs=3)
    seen: list[list[torch.Tensor]] = [[], []]

    class Moments(TrainerCallback):
        def __init__(self, into: list[torch.Tensor]) -> None:
            self.into = into

        def on_evaluate(self, args, state, control, **kwargs) -> None:
            opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
            weight = trainer.model.encoder[0].base.weight
            self.into.append(opt.state[weight]["exp_avg"].clone())

    trainer.add_callback(Moments(seen[0]))  # before the growth callback, then after it
    growth = DendriteGrowthCallback(monitor="eval_accuracy", switch_mode="fixed",
                                    fixed_switch_num=2, growth="neurons", max_neuron_steps=1,
                                    write_files=False).bind(trainer)
    trainer.add_callback(Moments(seen[1]))
    trainer.train()
    assert "added neuron step 1" in growth.controller.state.history[1]["reason"]
    logged = [row["perfora/neuron_steps"] for row in trainer.state.log_history
              if "perfora/neuron_steps" in row]
    assert logged[:2] == [0.0, 1.0]  # logged after each evaluation's step
    # and printed, with the epoch and the reason, on the main process
    printed = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("DendriteGrowthCallback:")]
    assert printed[0] == ("DendriteGrowthCallback: epoch 2: "
                          + growth.controller.state.history[1]["reason"])
    old, new = seen[0][1], seen[1][1]  # around the neuron step
    width = old.shape[0]
    assert new.shape[0] > width and torch.equal(new[:width], old) and not new[width:].any()


def test_a_monitor_reported_by_one_of_several_eval_datasets_does_not_warn(tmp_path):
    # each eval dataset reports on its own: the first one without the monitor warned that
    # nothing could grow, although the other one reported it every epoch
    from hf_tiny import Blobs

    trainer = make_trainer(str(tmp_path), epochs=2)
    trainer.eval_dataset = {"a": Blobs(64, 2), "b": Blobs(64, 3)}
    growth = DendriteGrowthCallback(monitor="eval_a_accuracy", mode="max",
                                    write_files=False).bind(trainer)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.train()
    assert not [w for w in record if "found no such metric" in str(w.message)]
    assert growth.controller.epoch == 2


def test_a_monitor_no_eval_dataset_reports_stops_the_run_naming_the_metrics(tmp_path):
    # it warned once and trained on without growing: a typo cost the whole run. The Trainer
    # itself refuses a metric_for_best_model that evaluation does not report, at the same
    # point: after the first round of evaluation
    trainer = make_trainer(str(tmp_path), epochs=3)
    growth = DendriteGrowthCallback(monitor="eval_acc", mode="max",
                                    write_files=False).bind(trainer)
    with pytest.raises(perfora.ConfigError, match=r"found no such metric after evaluation "
                       r"\(did you mean 'eval_accuracy'\?\); the metrics are \[.*'eval_loss'"):
        trainer.train()
    assert growth.controller.epoch == 0
    evaluated = [row for row in trainer.state.log_history if "eval_loss" in row]
    assert len(evaluated) == 1  # stopped before a second epoch
