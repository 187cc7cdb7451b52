"""The quality benchmark's output: markdown tables and one plot per task."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _fmt(value: float | None, spec: str = "+.1f") -> str:
    return "" if value is None else format(value, spec)


def _yes(flag: bool | None) -> str:
    return "" if flag is None else ("yes" if flag else "no")


def _percent(value: float | None) -> float | None:
    return None if value is None else 100 * value


def _beyond(row: dict[str, Any], key: str) -> str:
    return " (beyond)" if row.get(f"beyond_{key}") else ""


def _short(row: dict[str, Any]) -> str:
    n = row.get("matched_short")
    return f" (budget short on {n} seeds)" if n else ""


def task_table(name: str, summary: dict[str, Any]) -> str:
    """Markdown: both curves, then arms (accuracies in %, comparisons in points)."""
    budget_arm = summary.get("budget_arm")
    lines = [f"### {name} (start width {summary['start_width']})", "",
             "| run | params | median | q25 | q75 | dendrites | neurons | epochs | s "
             "| vs_curve | vs_matched | vs_start |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    matched = [{**p, "name": f"{p['name']}, {budget_arm}'s epochs", "seconds": None}
               for p in summary.get("matched_curve", [])]
    for row in summary["curve"] + matched + summary["arms"]:
        seconds = "" if row["seconds"] is None else f"{row['seconds']:.1f}"
        lines.append(
            f"| {row['name']} | {row['params']:.0f} | {100 * row['median']:.1f} | "
            f"{100 * row['q25']:.1f} | {100 * row['q75']:.1f} | {row['dendrites']:g} | "
            f"{row.get('neurons', 0):g} | {row['epochs']:g} | {seconds} | "
            f"{_fmt(row.get('vs_curve'))}{_beyond(row, 'curve')} | "
            f"{_fmt(row.get('vs_matched'))}{_beyond(row, 'matched')}{_short(row)} | "
            f"{_fmt(row.get('vs_start'))} |")
    return "\n".join(lines)


def summary_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: every task and arm against both curves and the start network."""
    lines = ["| task | arm | params | dendrites | neurons | kept | epochs | vs_curve "
             "| vs_matched | vs_start | counts |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        beyond = " (beyond)" if r["beyond_curve"] else ""
        lines.append(f"| {r['task']} | {r['arm']} | {r['params']:.0f} | {r['dendrites']:g} | "
                     f"{r['neurons']:g} | {r['kept']}/{r['runs']} | {r['epochs']:g} | "
                     f"{_fmt(r['vs_curve'])}{beyond} | {_fmt(r['vs_matched'])} | "
                     f"{_fmt(r['vs_start'])} | {_yes(r['counts'])} |")
    return "\n".join(lines)


def width_search_table(summaries: dict[str, dict[str, Any]], arms: tuple[str, ...]) -> str:
    """Markdown: the early-stopped curve as a width sweep against one grown run per arm."""
    lines = ["| task | best width | its params | its median | sweep epochs | arm | arm median "
             "| arm epochs | within 1 point, fewer epochs | arm at the sweep's epochs "
             "| within 1 point by then |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for task, summary in summaries.items():
        search = summary["width_search"]
        if search is None:
            continue
        for arm in summary["arms"]:
            if arm["name"] not in arms:
                continue
            flag = arm["near_best_width"] and arm["fewer_epochs_than_sweep"]
            lines.append(f"| {task} | {search['best_width']} | {search['best_params']:.0f} | "
                         f"{100 * search['best_median']:.1f} | {search['sweep_epochs']:g} | "
                         f"{arm['name']} | {100 * arm['median']:.1f} | {arm['epochs']:g} | "
                         f"{_yes(flag)} | {_fmt(_percent(arm.get('at_sweep_budget')), '.1f')} "
                         f"| {_yes(arm.get('near_best_width_by_sweep_budget'))} |")
    return "\n".join(lines)


def targets_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: the issue's targets per task and judged arm, with a count of each column."""
    keys = ("at_matched", "at_matched_paired", "above_start", "beats_curves_by_2",
            "width_search", "width_search_by_budget", "spirals_95")
    lines = ["| task | arm | median | vs_matched | paired | vs_curve | vs_start "
             "| >= matched - 0.5 | paired | >= start + 1 | >= both curves + 2 | width search "
             "| by the sweep's epochs | spirals >= 95% |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['arm']} | {100 * r['median']:.1f} | "
                     f"{_fmt(r['vs_matched'])} | {_fmt(r.get('vs_matched_paired'))} | "
                     f"{_fmt(r['vs_curve'])} | "
                     f"{_fmt(r['vs_start'])} | " + " | ".join(_yes(r.get(k)) for k in keys) + " |")
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        counts = [f"{sum(bool(r.get(k)) for r in mine)}/"
                  f"{sum(r.get(k) is not None for r in mine)}"
                  for k in keys]
        lines.append(f"| **met** | {arm} | | | | | | " + " | ".join(counts) + " |")
    return "\n".join(lines)


def plot(name: str, summary: dict[str, Any], path: Path) -> None:
    """Test accuracy vs parameters (log x): both curves with quartile bands, arms as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.0, 4.6))
    matched = summary.get("matched_curve", [])
    budget = f" (median {matched[0]['epochs']:g})" if matched else ""
    curves = [(summary["curve"], "o-", "0.3", "plain network, early-stopped, widths "),
              (matched, "o--", "tab:blue",
               f"plain network, {summary.get('budget_arm')}'s epochs{budget}, widths ")]
    for curve, style, color, label in curves:
        if not curve:
            continue
        p = [c["params"] for c in curve]
        ax.plot(p, [100 * c["median"] for c in curve], style, color=color,
                label=label + ", ".join(str(c["width"]) for c in curve))
        ax.fill_between(p, [100 * c["q25"] for c in curve], [100 * c["q75"] for c in curve],
                        color=color, alpha=0.12, linewidth=0)
    markers = "sD^vP*Xhp<>d"
    colors = plt.get_cmap("tab20").colors
    for i, arm in enumerate(summary["arms"]):
        y, x = 100 * arm["median"], arm["params"]
        grown = ", ".join([f"{arm['dendrites']:g} dendrites"] * bool(
            arm["dendrites"] or not arm.get("neurons"))
            + [f"{arm['neurons']:g} neuron steps"] * bool(arm.get("neurons")))
        ax.errorbar(x, y, yerr=[[y - 100 * arm["q25"]], [100 * arm["q75"] - y]],
                    xerr=[[x - arm["params_q25"]], [arm["params_q75"] - x]],
                    fmt=markers[i % len(markers)], ms=10 - 2 * (i % 3), capsize=3,
                    color="black" if arm["name"] == "default" else colors[(2 * i) % 20],
                    label=f"{arm['name']} ({grown})")
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("test accuracy (%)")
    runs = max((c["runs"] for c in summary["curve"] + summary["arms"]), default=0)
    ax.set_title(f"{name}: growth vs a wider network\n(median and quartiles over {runs} "
                 "seeds; markers: grown arms)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
