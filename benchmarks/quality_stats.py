"""The quality benchmark's statistics: curves, comparisons at an arm's size, width search,
targets, and saved runs merged.

Rows come from quality.py: ``kind`` "curve" (a width, early-stopped), "arm" (a grown run on
the start width) or "matched" (a width trained without early stopping). A row's ``trace``
lists (epoch, test accuracy) at each new best validation score, so its result after any
budget of epochs is the last entry at or before that epoch (arm rows saved before arms
recorded it have none).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

TARGET_ARMS: tuple[str, ...] = ("default", "auto", "dendrites", "neurons_gradmax",
                                "neurons_random", "learn_train_acc", "learn_train_loss")
"""Arms the targets table and the width search judge (those that ran)."""

BUDGET_ARM = "default"
"""The arm whose epochs the tables' and plots' matched-budget curve uses (else the first)."""


def stats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and quartiles of the test accuracy and parameters; medians of the rest."""
    acc = [r["test"] for r in runs]
    q25, med, q75 = np.percentile(acc, [25, 50, 75]).tolist()
    params = [r["params"] for r in runs]
    p25, pmed, p75 = np.percentile(params, [25, 50, 75]).tolist()
    return {"runs": len(runs), "median": med, "q25": q25, "q75": q75, "params": pmed,
            "params_q25": p25, "params_q75": p75,
            "dendrites": float(np.median([r.get("dendrites", 0) for r in runs])),
            "kept": sum(r.get("dendrites", 0) > 0 or r.get("neurons", 0) > 0 for r in runs),
            "neurons": float(np.median([r.get("neurons", 0) for r in runs])),
            "epochs": float(np.median([r["epochs"] for r in runs])),
            "capped": sum(bool(r.get("capped")) for r in runs),
            "seconds": float(np.median([r["seconds"] for r in runs]))}


def curve_at(curve: list[dict[str, Any]], params: float) -> tuple[float, bool]:
    """The curve's median accuracy at ``params``: linear in log(params) between consecutive
    points; clamped to the end point and flagged (True) outside the curve's range."""
    pts = sorted((p["params"], p["median"]) for p in curve)
    if params < pts[0][0]:
        return pts[0][1], True
    if params > pts[-1][0]:
        return pts[-1][1], True
    for (p0, a0), (p1, a1) in zip(pts, pts[1:]):
        if p0 <= params <= p1:
            t = 0.0 if p1 == p0 else (math.log(params) - math.log(p0)) / (
                math.log(p1) - math.log(p0))
            return a0 + t * (a1 - a0), False
    return pts[-1][1], False  # a single-point curve at exactly ``params``


def at_budget(trace: list[list[float]], budget: float) -> float:
    """Test accuracy at the best validation epoch within the first ``budget`` epochs."""
    best = trace[0][1]
    for epoch, test in trace:
        if epoch > budget:
            break
        best = test
    return best


def matched_curve(matched: list[dict[str, Any]], budgets: dict[int, int]
                  ) -> list[dict[str, Any]]:
    """The width curve trained ``budgets[seed]`` epochs per seed, no early stopping."""
    curve = []
    for width in sorted({r["width"] for r in matched}):
        runs = [{**r, "test": at_budget(r["trace"], budgets[r["seed"]]),
                 "epochs": budgets[r["seed"]]}
                for r in matched if r["width"] == width and r["seed"] in budgets]
        if runs:
            curve.append({"name": f"width {width}", "width": width, **stats(runs)})
    return curve


def width_search(curve: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The early-stopped curve as a user's width sweep: its best width (by median test
    accuracy, the smaller on a tie) and its total epochs (sum over widths, median over
    seeds)."""
    best = max(curve, key=lambda p: (p["median"], -p["params"]))
    per_seed: dict[int, int] = {}
    for r in rows:
        per_seed[r["seed"]] = per_seed.get(r["seed"], 0) + r["epochs"]
    return {"best_width": best["width"], "best_params": best["params"],
            "best_median": best["median"],
            "sweep_epochs": float(np.median(list(per_seed.values()))),
            "sweep_epochs_per_seed": per_seed}


def at_sweep_budget(runs: list[dict[str, Any]], search: dict[str, Any]) -> float | None:
    """Median over seeds of each grown run cut one epoch before its seed's whole width sweep
    ends: the test accuracy at its best validation epoch so far, the model a user who gave
    growth the sweep's epochs would hold. None without every run's trace or seed's sweep."""
    per_seed = {int(k): v for k, v in search.get("sweep_epochs_per_seed", {}).items()}
    if not runs or any("trace" not in r or r["seed"] not in per_seed for r in runs):
        return None
    return float(np.median([at_budget(r["trace"], per_seed[r["seed"]] - 1) for r in runs]))


def _compare(arm: dict[str, Any], curve: list[dict[str, Any]], key: str) -> None:
    if curve:
        at, beyond = curve_at(curve, arm["params"])
        arm.update({f"{key}_acc": at, f"beyond_{key}": beyond, f"vs_{key}": 100 * (
            arm["median"] - at)})


def paired(runs: list[dict[str, Any]], widths: list[dict[str, Any]],
           budgeted: bool = False) -> float | None:
    """Median over seeds of (a run's test accuracy - its own seed's curve at the run's
    params), in points: the comparison without the spread between the seeds' data splits.
    ``widths``: curve rows (early-stopped) or matched rows (``budgeted``: each scored after
    the run's epochs)."""
    diffs = []
    for run in runs:
        points = [{"params": w["params"], "median": at_budget(w["trace"], run["epochs"])
                   if budgeted else w["test"]} for w in widths if w["seed"] == run["seed"]]
        if points:
            diffs.append(100 * (run["test"] - curve_at(points, run["params"])[0]))
    return float(np.median(diffs)) if diffs else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: both curves, width search, and arms with their statistics and comparisons."""
    out: dict[str, dict[str, Any]] = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task and "error" not in r]
        es_rows = [r for r in mine if r["kind"] == "curve"]
        matched = [r for r in mine if r["kind"] == "matched"]
        curve = [{"name": f"width {w}", "width": w, **stats([r for r in es_rows
                                                             if r["width"] == w])}
                 for w in sorted({r["width"] for r in es_rows})]
        arm_rows = [r for r in mine if r["kind"] == "arm"]
        start = arm_rows[0]["width"] if arm_rows else min(
            (p["width"] for p in curve), default=None)
        start_point = next((p for p in curve if p["width"] == start), None)
        search = width_search(curve, es_rows) if curve else None
        arms = []
        for name in dict.fromkeys(r["name"] for r in arm_rows):
            runs = [r for r in arm_rows if r["name"] == name]
            arm = {"name": name, **stats(runs)}
            _compare(arm, curve, "curve")
            budgets = {r["seed"]: r["epochs"] for r in runs}
            _compare(arm, matched_curve(matched, budgets), "matched")
            arm["vs_curve_paired"] = paired(runs, es_rows)
            arm["vs_matched_paired"] = paired(runs, matched, budgeted=True)
            # seeds where the arm trained longer than the matched runs did (an arm run on
            # its own, after them): there the curve's budget falls short of the arm's
            arm["matched_short"] = sum(1 for r in matched if budgets.get(r["seed"], 0)
                                       > r["epochs"]) // max(1, len({r["width"]
                                                                   for r in matched}))
            if start_point is not None:
                arm["vs_start"] = 100 * (arm["median"] - start_point["median"])
            if search is not None:
                arm["near_best_width"] = bool(arm["median"] >= search["best_median"] - 0.01)
                arm["fewer_epochs_than_sweep"] = bool(arm["epochs"] < search["sweep_epochs"])
                cut = at_sweep_budget(runs, search)
                arm["at_sweep_budget"] = cut
                arm["near_best_width_by_sweep_budget"] = None if cut is None else bool(
                    cut >= search["best_median"] - 0.01)
            arms.append(arm)
        names = [a["name"] for a in arms]
        budget_arm = BUDGET_ARM if BUDGET_ARM in names else (names[0] if names else None)
        budgets = {r["seed"]: r["epochs"] for r in arm_rows if r["name"] == budget_arm}
        out[task] = {"start_width": start, "curve": curve, "budget_arm": budget_arm,
                     "matched_curve": matched_curve(matched, budgets) if matched else [],
                     "width_search": search, "arms": arms,
                     "errors": [r for r in rows if r["task"] == task and "error" in r]}
    return out


def _flag(value: float | None, bound: float) -> bool | None:
    return None if value is None else bool(value >= bound)


def summary_rows(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Task x arm: both comparisons, and whether the arm reaches the early-stopped curve."""
    rows = []
    for task, summary in summaries.items():
        for arm in summary["arms"]:
            vs, start = arm.get("vs_curve"), arm.get("vs_start")
            rows.append({"task": task, "arm": arm["name"], "params": arm["params"],
                         "dendrites": arm["dendrites"], "neurons": arm["neurons"],
                         "kept": arm["kept"], "runs": arm["runs"], "epochs": arm["epochs"],
                         "vs_curve": vs, "vs_matched": arm.get("vs_matched"),
                         "vs_matched_paired": arm.get("vs_matched_paired"),
                         "vs_curve_paired": arm.get("vs_curve_paired"),
                         "matched_short": arm.get("matched_short", 0),
                         "vs_start": start, "beyond_curve": arm.get("beyond_curve"),
                         "reaches_curve": _flag(vs, 0),
                         # the older target: at or above the early-stopped curve, grown in
                         # the median run and at least 1 point above the start
                         "counts": None if vs is None or start is None else bool(
                             vs >= 0 and (arm["dendrites"] >= 1 or arm["neurons"] >= 1)
                             and start >= 1)})
    return rows


def target_rows(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets per task, for each of :data:`TARGET_ARMS` that ran (medians over
    seeds; ``None``: not measurable, e.g. no curve)."""
    rows = []
    for task, summary in summaries.items():
        search = summary["width_search"]
        for arm in summary["arms"]:
            if arm["name"] not in TARGET_ARMS:
                continue
            vs_c, vs_m, start = arm.get("vs_curve"), arm.get("vs_matched"), arm.get("vs_start")
            both = None if vs_c is None or vs_m is None else min(vs_c, vs_m)
            rows.append({
                "task": task, "arm": arm["name"], "median": arm["median"],
                "params": arm["params"], "epochs": arm["epochs"], "vs_start": start,
                "vs_curve": vs_c, "vs_matched": vs_m,
                "vs_matched_paired": arm.get("vs_matched_paired"),
                "sweep_epochs": None if search is None else search["sweep_epochs"],
                "best_width_median": None if search is None else search["best_median"],
                "at_matched": _flag(vs_m, -0.5),
                "at_matched_paired": _flag(arm.get("vs_matched_paired"), -0.5),
                "above_start": _flag(start, 1.0),
                "beats_curves_by_2": _flag(both, 2.0),
                "width_search": None if search is None else bool(
                    arm["near_best_width"] and arm["fewer_epochs_than_sweep"]),
                "at_sweep_budget": arm.get("at_sweep_budget"),
                "width_search_by_budget": arm.get("near_best_width_by_sweep_budget"),
                "spirals_95": bool(arm["median"] >= 0.95) if task == "spirals" else None})
    return rows


SETUP_BEFORE: dict[str, Any] = {"improvement_threshold": 1e-3}
"""Settings that saved runs made before the harness recorded them all ran with."""


def _run_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in ("task", "seed", "kind", "name", "width"))


def merge_saved(saved: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any],
                                                      float]:
    """The runs of several saved results together (their settings must match, bar the arms,
    skipped arms and run counts), with the sum of their times and the commands' arms merged.
    A run of the same task, seed, kind, name and width in a later file replaces the earlier
    one (an arm run again after a change replaces its stored runs)."""
    setup = dict(saved[0]["setup"])
    for other in saved[1:]:
        theirs = other["setup"]
        for key in ("patience", "max_dendrites", "max_epochs", "lr", "seeds", "quick",
                    "improvement_threshold"):
            if theirs.get(key, SETUP_BEFORE.get(key)) != setup.get(key, SETUP_BEFORE.get(key)):
                raise SystemExit(f"--summarize: the saved runs differ in {key}: "
                                 f"{setup.get(key)} and {theirs.get(key)}")
        setup["arms"] = {**setup.get("arms", {}), **theirs.get("arms", {})}
        setup["skipped_arms"] = {**setup.get("skipped_arms", {}),
                                 **theirs.get("skipped_arms", {})}
    # an arm one command skipped (an older perfora) and another ran is not skipped
    setup["skipped_arms"] = {k: v for k, v in setup.get("skipped_arms", {}).items()
                             if k not in setup.get("arms", {})}
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in (r for s in saved for r in s["runs"]):
        latest.pop(_run_key(r), None)  # re-inserted last: the order follows the files
        latest[_run_key(r)] = r
    rows = list(latest.values())
    setup["runs"] = len(rows)
    return rows, setup, sum(s["total_seconds"] for s in saved)
