"""The quality benchmark compares a grown arm fairly: with a width curve trained as long as
the arm, with the whole width sweep a user would run, and it survives arms the installed
perfora does not know."""

from __future__ import annotations

import argparse
import sys

import pytest

from tests.unit.benchmarks.test_output_paths import BENCHMARKS, load

pytestmark = pytest.mark.skipif(not (BENCHMARKS / "quality_stats.py").exists(),
                                reason="needs the benchmarks folder")


def _stats():
    load("quality")  # puts benchmarks/ on sys.path, as the script has it
    return sys.modules["quality_stats"]


def _curve(seed: int, width: int, params: int, test: float, epochs: int) -> dict:
    return {"task": "t", "seed": seed, "kind": "curve", "name": f"width {width}",
            "width": width, "test": test, "params": params, "epochs": epochs,
            "seconds": 1.0}


def _matched(seed: int, width: int, params: int, trace: list[list[float]]) -> dict:
    return {**_curve(seed, width, params, trace[-1][1], int(trace[-1][0])),
            "kind": "matched", "trace": trace}


def _arm(seed: int, test: float, params: int, epochs: int, name: str = "default") -> dict:
    return {"task": "t", "seed": seed, "kind": "arm", "name": name, "width": 4, "test": test,
            "params": params, "dendrites": 1, "epochs": epochs, "seconds": 1.0}


def test_a_matched_width_scores_at_its_best_validation_epoch_within_the_arms_epochs() -> None:
    qs = _stats()
    trace = [[1, 0.5], [40, 0.6], [90, 0.9]]  # new best validation scores at 1, 40, 90
    assert qs.at_budget(trace, 39) == 0.5
    assert qs.at_budget(trace, 89) == 0.6
    assert qs.at_budget(trace, 500) == 0.9


def test_each_arm_meets_the_curve_trained_as_long_as_it_trained_on_each_seed() -> None:
    qs = _stats()
    rows = [_curve(s, w, p, 0.5, 10) for s in (0, 1) for w, p in ((4, 100), (8, 400))]
    rows += [_matched(s, w, p, [[1, 0.5], [100, 0.8]]) for s in (0, 1)
             for w, p in ((4, 100), (8, 400))]
    rows += [_arm(s, 0.75, 200, 150) for s in (0, 1)]  # long enough to reach 0.8
    rows += [_arm(s, 0.75, 200, 50, "short") for s in (0, 1)]  # stops before epoch 100
    arms = {a["name"]: a for a in qs.summarize(rows)["t"]["arms"]}
    assert arms["default"]["vs_curve"] == pytest.approx(25.0)  # early-stopped: 0.5
    assert arms["default"]["vs_matched"] == pytest.approx(-5.0)  # 150 epochs: 0.8
    assert arms["short"]["vs_matched"] == pytest.approx(25.0)  # 50 epochs: still 0.5
    # the matched runs trained 100 epochs: short of the default's 150, said per seed
    assert (arms["default"]["matched_short"], arms["short"]["matched_short"]) == (2, 0)


def test_the_paired_comparison_meets_each_seed_s_own_curve_at_the_run_s_own_size() -> None:
    # wine's case: on 3 of 5 seeds the arm scores what that seed's plain network of its size
    # scores (the median of the per-seed differences: 0), but the seed that does not grow is
    # one whose wide network gains, so the medians (the arm's 0.9 at a median 400 params,
    # the curve's 1.0 there) differ by 10 points
    qs = _stats()
    acc = {0: (1.0, 1.0), 1: (0.9, 1.0), 2: (0.9, 1.0), 3: (1.0, 1.0), 4: (0.9, 0.9)}
    rows = [_matched(s, w, p, [[1, acc[s][i]]]) for s in acc
            for i, (w, p) in enumerate(((4, 100), (16, 400)))]
    rows += [_curve(s, w, p, acc[s][i], 1) for s in acc
             for i, (w, p) in enumerate(((4, 100), (16, 400)))]
    rows += [_arm(s, acc[s][0], 100 if s == 4 else 400, 50) for s in acc]
    arm = qs.summarize(rows)["t"]["arms"][0]
    assert arm["vs_matched"] == pytest.approx(-10.0)
    assert arm["vs_matched_paired"] == pytest.approx(0.0)  # of 0, -10, -10, 0, 0
    target = qs.target_rows(qs.summarize(rows))[0]
    assert (target["at_matched"], target["at_matched_paired"]) == (False, True)


def test_the_width_search_is_the_whole_sweep_against_one_grown_run() -> None:
    qs = _stats()
    rows = [_curve(s, 4, 100, 0.80, 30) for s in (0, 1, 2)]
    rows += [_curve(s, 8, 400, 0.90, 40) for s in (0, 1, 2)]
    rows += [_arm(s, 0.895, 300, 60) for s in (0, 1, 2)]  # within a point, 60 < 70 epochs
    rows += [_arm(s, 0.95, 300, 80, "slow") for s in (0, 1, 2)]  # better, but 80 > 70
    summary = qs.summarize(rows)["t"]
    assert summary["width_search"]["best_width"] == 8
    assert summary["width_search"]["sweep_epochs"] == 70
    targets = {r["arm"]: r for r in qs.target_rows({"t": summary})}
    assert targets["default"]["width_search"] is True
    assert "slow" not in targets  # only the judged arms (TARGET_ARMS)
    arm = next(a for a in summary["arms"] if a["name"] == "slow")
    assert arm["near_best_width"] and not arm["fewer_epochs_than_sweep"]


def test_the_width_search_by_the_sweep_s_epochs_cuts_each_grown_run_where_its_sweep_ends(
) -> None:
    # two spirals' case: the sweep's early-stopped widths end after few epochs at a low
    # accuracy, and the grown run goes on far longer to a far higher one; cut where its own
    # seed's sweep ends (70 and 90 epochs here), it already is within a point of the best width
    qs = _stats()
    rows = [_curve(s, 4, 100, 0.80, 30) for s in (0, 1, 2)]
    rows += [_curve(s, 8, 400, 0.90, 40 if s < 2 else 60) for s in (0, 1, 2)]  # 70, 70, 90
    traces = {0: [[1, 0.5], [60, 0.895], [500, 0.99]],  # within a point by epoch 69
              1: [[1, 0.5], [69, 0.90], [500, 0.99]],  # the last epoch before the sweep ends
              2: [[1, 0.5], [80, 0.95], [500, 0.99]]}  # by 89: its own sweep is longer
    rows += [{**_arm(s, 0.99, 300, 600), "trace": traces[s]} for s in (0, 1, 2)]
    late = {0: [[1, 0.5], [70, 0.95]], 1: [[1, 0.5], [70, 0.95]], 2: [[1, 0.5], [90, 0.95]]}
    rows += [{**_arm(s, 0.95, 300, 600, "dendrites"), "trace": late[s]} for s in (0, 1, 2)]
    rows += [_arm(s, 0.99, 300, 600, "neurons_random") for s in (0, 1, 2)]  # no traces
    targets = {r["arm"]: r for r in qs.target_rows(qs.summarize(rows))}
    assert targets["default"]["width_search"] is False  # 600 epochs against the sweep's 70
    assert targets["default"]["width_search_by_budget"] is True
    assert targets["default"]["at_sweep_budget"] == pytest.approx(0.90)  # of .895, .90, .95
    # the same accuracy reached only at the epoch each sweep ends is not in fewer epochs
    assert targets["dendrites"]["width_search_by_budget"] is False
    assert targets["dendrites"]["at_sweep_budget"] == pytest.approx(0.5)
    assert targets["neurons_random"]["width_search_by_budget"] is None  # runs saved untraced


def test_an_arm_the_installed_perfora_rejects_is_skipped_and_a_bad_custom_arm_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    quality = load("quality")
    parser = argparse.ArgumentParser()
    setup = quality.Setup(patience=2, max_dendrites=1, max_epochs=5)
    arms = {"default": {}, "future": {"growth": "no-such-growth"},
            "typo": {"no_such_setting": 1}}
    kept, skipped = quality._accepted_arms(parser, arms, list(arms), setup)
    assert kept == ["default"]
    assert set(skipped) == {"future", "typo"}
    assert "skipping arm 'future'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        quality._accepted_arms(parser, {"custom": {"growth": "no-such-growth"}}, ["custom"],
                               setup)


def test_runs_saved_apart_are_reported_together_only_with_the_same_settings() -> None:
    qs = _stats()
    setup = {"patience": 10, "max_dendrites": 4, "max_epochs": 2000, "lr": 0.01,
             "seeds": [0, 1], "quick": False, "arms": {"default": {}}}
    one = {"setup": setup, "total_seconds": 5.0, "runs": [_arm(0, 0.5, 10, 5)]}
    two = {"setup": {**setup, "arms": {"gd": {}}}, "total_seconds": 7.0,
           "runs": [_arm(1, 0.5, 10, 5)]}
    rows, merged, total = qs.merge_saved([one, two])
    assert len(rows) == 2 and total == 12.0 and set(merged["arms"]) == {"default", "gd"}
    with pytest.raises(SystemExit, match="patience"):
        qs.merge_saved([one, {**two, "setup": {**setup, "patience": 8}}])


def test_runs_made_with_another_improvement_threshold_are_not_reported_together() -> None:
    qs = _stats()
    setup = {"patience": 10, "max_dendrites": 4, "max_epochs": 2000, "lr": 0.01,
             "seeds": [0, 1], "quick": False, "arms": {"default": {}}}
    before = {"setup": setup, "total_seconds": 1.0, "runs": [_arm(0, 0.5, 10, 5)]}  # 1e-3
    same = {"setup": {**setup, "improvement_threshold": 1e-3}, "total_seconds": 1.0,
            "runs": [_arm(1, 0.5, 10, 5)]}
    assert len(qs.merge_saved([before, same])[0]) == 2
    other = {**same, "setup": {**setup, "improvement_threshold": 1e-4}}
    with pytest.raises(SystemExit, match="improvement_threshold"):
        qs.merge_saved([before, other])


def test_the_improvement_threshold_option_sets_every_run_s_and_refuses_a_negative_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    quality = load("quality")
    args = quality.build_parser().parse_args(["--improvement-threshold", "1e-4"])
    setup = quality.Setup(patience=2, max_dendrites=1, max_epochs=5,
                          improvement_threshold=args.improvement_threshold)
    assert quality.make_config(setup, 1, 0, {}).improvement_threshold == 1e-4
    assert quality.build_parser().parse_args([]).improvement_threshold == 1e-3
    with pytest.raises(SystemExit):
        quality.main(["--improvement-threshold", "-0.1", "--datasets", "wine"])
    assert "non-negative" in capsys.readouterr().err


def test_an_arm_run_again_replaces_its_stored_runs_when_reported_together() -> None:
    qs = _stats()
    setup = {"patience": 10, "max_dendrites": 4, "max_epochs": 2000, "lr": 0.01,
             "seeds": [0, 1], "quick": False, "arms": {"default": {}}}
    stored = {"setup": setup, "total_seconds": 5.0,
              "runs": [_arm(0, 0.5, 10, 5), _arm(1, 0.6, 10, 5)]}
    again = {"setup": setup, "total_seconds": 2.0, "runs": [_arm(1, 0.9, 10, 5)]}
    rows, merged, _ = qs.merge_saved([stored, again])
    assert [(r["seed"], r["test"]) for r in rows] == [(0, 0.5), (1, 0.9)]
    assert merged["runs"] == 2


def test_every_arm_that_grows_neurons_gets_as_many_steps_as_sets_the_default_too() -> None:
    quality = load("quality")
    setup = quality.Setup(patience=2, max_dendrites=3, max_epochs=5)
    for overrides in ({}, {"growth": "auto"}, {"growth": "neurons"}):  # {}: the default, auto
        assert quality.make_config(setup, 1, 0, overrides).max_neuron_steps == 3, overrides
    assert quality.make_config(setup, 1, 0, {"growth": "dendrites"}).max_dendrites == 3


def test_the_mobilenet_task_grows_its_expansions_through_the_depthwise_convs() -> None:
    import torch

    import perfora

    load("quality")
    tasks = sys.modules["quality_tasks"]
    model = perfora.perforate(tasks.mbconv(8)).eval()
    plan = perfora.plan_widening(model)
    assert plan.widenable == ["3.block.0", "5.block.0"]  # each block's expansion, nothing else
    assert [p for p, _ in plan.layers["3.block.0"].through] == ["3.block.1", "3.block.2",
                                                                "3.block.3", "3.block.4",
                                                                "3.block.5"]
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(x)
        for path in plan.widenable:
            perfora.widen(model, path, 8)
        assert torch.equal(model(x), before)
    wide = perfora.perforate(tasks.mbconv(16))  # what the curve's 2x point trains
    assert sum(p.numel() for p in model.parameters()) == \
        sum(p.numel() for p in wide.parameters())


def test_a_run_without_datasets_runs_the_stored_six_tasks_and_the_mobilenet_one_when_named(
) -> None:
    quality = load("quality")
    tasks = sys.modules["quality_tasks"]
    assert tasks.default_tasks() == ["digits", "wine", "breast_cancer", "spirals", "mnist1d",
                                     "digits_cnn"]
    assert quality.build_parser().parse_args(["--datasets", "digits_mbconv"]).datasets == \
        ["digits_mbconv"]


def test_a_grown_run_records_its_best_validation_epochs_so_it_can_be_cut_at_any_budget(
) -> None:
    quality = load("quality")
    task = quality.load_task("spirals", 0)
    setup = quality.Setup(patience=2, max_dendrites=1, max_epochs=8)  # x5 on spirals
    row = quality.run_controller(task, task.width, 0, setup, {})
    epochs = [epoch for epoch, _ in row["trace"]]
    assert epochs == sorted(set(epochs)) and epochs[-1] <= row["epochs"]
    # the run's score is the test accuracy at its last best validation epoch
    assert row["trace"][-1][1] == row["test"]
    assert quality.qs.at_budget(row["trace"], row["epochs"]) == row["test"]
