"""benchmarks/README.md's tables of ``quality.py`` (see tables.py), from the stored JSON.

``quality.json`` is the current full run; ``quality_dendrite_arms.json`` the earlier full run
of the dendrite variants (kept: the text on those arms comes from it);
``quality_threshold_1e-3.json`` and ``_1e-4.json`` the default and both curves with each
improvement threshold, with every run's trace (the width search cut where the sweep ends).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def _rows(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _points(value: float | None) -> str:
    return "" if value is None else f"{value:+.1f}"


def _yes(flag: bool | None) -> str:
    return "" if flag is None else ("yes" if flag else "no")


def _arms(name: str) -> str:
    out = []
    for r in _load(name)["summary"]:
        beyond = " (beyond)" if r.get("beyond_curve") else ""
        out.append([r["task"], r["arm"], f"{r['params']:.0f}", f"{r['dendrites']:g}",
                    f"{r.get('neurons', 0):g}", f"{r['kept']}/{r['runs']}",
                    f"{r['epochs']:g}" if "epochs" in r else "",
                    _points(r["vs_curve"]) + beyond, _points(r.get("vs_matched")) + (
                        f" (budget short on {r['matched_short']} seeds)"
                        if r.get("matched_short") else ""),
                    _points(r["vs_start"]), _yes(r["counts"])])
    return _rows(["task", "arm", "params", "dendrites", "neuron steps", "kept", "epochs",
                  "vs_curve", "vs_matched", "vs_start", "counts"], out)


def table_quality() -> str:
    """Every task and arm against both width curves (medians over seeds)."""
    return _arms("quality.json")


def table_quality_dendrite_arms() -> str:
    """The earlier run of the dendrite variants against the early-stopped curve."""
    out = []
    for r in _load("quality_dendrite_arms.json")["summary"]:
        beyond = " (beyond)" if r.get("beyond_curve") else ""
        out.append([r["task"], r["arm"], f"{r['params']:.0f}", f"{r['dendrites']:g}",
                    f"{r['kept']}/{r['runs']}", _points(r["vs_curve"]) + beyond,
                    _points(r["vs_start"]), _yes(r["counts"])])
    return _rows(["task", "arm", "params", "dendrites (median)", "kept", "vs_curve",
                  "vs_start", "counts"], out)


def table_quality_curve() -> str:
    """Both width curves: median test accuracy (%) at each width (params in brackets)."""
    out = []
    for task, summary in _load("quality.json")["tasks"].items():
        out.append([task, "early-stopped", ", ".join(
            f"{c['width']}: {100 * c['median']:.1f} ({c['params']:.0f}; {c['epochs']:g} ep)"
            for c in summary["curve"])])
        if summary.get("matched_curve"):
            matched = summary["matched_curve"]
            out.append([task, f"{summary['budget_arm']}'s epochs ({matched[0]['epochs']:g})",
                        ", ".join(f"{c['width']}: {100 * c['median']:.1f}" for c in matched)])
    return _rows(["task", "trained", "width: median % (params; median epochs)"], out)


def table_quality_width_search() -> str:
    """The early-stopped curve as a user's width sweep against one grown run."""
    result = _load("quality.json")
    out = []
    for r in result["targets"]:
        out.append([r["task"], r["arm"], f"{100 * r['best_width_median']:.1f}",
                    f"{r['sweep_epochs']:g}", f"{100 * r['median']:.1f}", f"{r['epochs']:g}",
                    _yes(r["width_search"])])
    return _rows(["task", "arm", "best width's median", "sweep epochs", "arm median",
                  "arm epochs", "within 1 point in fewer epochs"], out)


def table_quality_width_budget() -> str:
    """The width search with the default's runs also cut where each seed's sweep ends (the
    1e-3 run of ``quality_threshold_1e-3.json``: the default and both curves, with traces)."""
    out = []
    for r in _load("quality_threshold_1e-3.json")["targets"]:
        if r["arm"] != "default":
            continue
        out.append([r["task"], f"{100 * r['best_width_median']:.1f}", f"{r['sweep_epochs']:g}",
                    f"{100 * r['median']:.1f}", f"{r['epochs']:g}", _yes(r["width_search"]),
                    f"{100 * r['at_sweep_budget']:.1f}", _yes(r["width_search_by_budget"])])
    return _rows(["task", "best width's median", "sweep epochs", "default median",
                  "default epochs", "within 1 point in fewer epochs",
                  "default cut where the sweep ends", "within 1 point by then"], out)


THRESHOLD_RUNS = (("1e-3", "quality_threshold_1e-3.json"), ("1e-4", "quality_threshold_1e-4.json"))
"""The default arm and both curves, every run with the harness's threshold and the library's."""
THRESHOLD_KEYS = ("at_matched", "at_matched_paired", "above_start", "beats_curves_by_2",
                  "width_search", "width_search_by_budget", "spirals_95")


def table_quality_threshold() -> str:
    """The default's targets with each improvement threshold (curves and arm alike)."""
    out = []
    for threshold, name in THRESHOLD_RUNS:
        rows = [r for r in _load(name)["targets"] if r["arm"] == "default"]
        out += [[r["task"], threshold, f"{100 * r['median']:.1f}", f"{r['params']:.0f}",
                 f"{r['epochs']:g}", _points(r["vs_matched"]),
                 _points(r.get("vs_matched_paired")), _points(r["vs_start"])]
                + [_yes(r.get(k)) for k in THRESHOLD_KEYS] for r in rows]
        out.append(["**met**", threshold, "", "", "", "", "", ""] + [
            f"{sum(bool(r.get(k)) for r in rows)}/{sum(r.get(k) is not None for r in rows)}"
            for k in THRESHOLD_KEYS])
    return _rows(["task", "threshold", "median %", "params", "epochs", "vs_matched", "paired",
                  "vs_start", ">= matched - 0.5", "paired", ">= start + 1",
                  ">= both curves + 2", "width search", "by the sweep's epochs",
                  "spirals >= 95%"], out)


TARGET_KEYS = ("at_matched", "at_matched_paired", "above_start", "beats_curves_by_2",
               "width_search", "spirals_95")


def table_quality_targets() -> str:
    """The issue's targets per task and judged arm; the last rows count each column."""
    rows = _load("quality.json")["targets"]
    out = [[r["task"], r["arm"], f"{100 * r['median']:.1f}", _points(r["vs_matched"]),
            _points(r.get("vs_matched_paired")), _points(r["vs_curve"]),
            _points(r["vs_start"])] + [_yes(r.get(k)) for k in TARGET_KEYS] for r in rows]
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        out.append(["**met**", arm, "", "", "", "", ""] + [
            f"{sum(bool(r.get(k)) for r in mine)}/{sum(r.get(k) is not None for r in mine)}"
            for k in TARGET_KEYS])
    return _rows(["task", "arm", "median %", "vs_matched", "paired", "vs_curve", "vs_start",
                  ">= matched - 0.5", "paired", ">= start + 1", ">= both curves + 2",
                  "width search", "spirals >= 95%"], out)


def table_quality_setup() -> str:
    """How the stored run was made."""
    result = _load("quality.json")
    setup = result["setup"]
    return _rows(["seeds", "patience", "max sets / steps", "epoch cap", "lr", "runs", "jobs",
                  "seconds", "torch"],
                 [[str(len(setup["seeds"])), str(setup["patience"]),
                   str(setup["max_dendrites"]), f"{setup['max_epochs']:,}", f"{setup['lr']:g}",
                   str(len(result["runs"])), str(setup["jobs"]),
                   f"{result['total_seconds']:.0f}", setup["torch"]]])


TABLES = {"quality-setup": table_quality_setup, "quality": table_quality,
          "quality-curve": table_quality_curve, "quality-width-search": table_quality_width_search,
          "quality-targets": table_quality_targets,
          "quality-width-budget": table_quality_width_budget,
          "quality-threshold": table_quality_threshold,
          "quality-dendrite-arms": table_quality_dendrite_arms}
