"""Run files: metrics.csv (per epoch), best_arch_scores.csv (per architecture), history.png."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..checkpoint.files import (
    append_text,
    atomic_write_bytes,
    atomic_write_text,
    remove_stale_temp_files,
)
from .history_marks import HistoryMarks, history_marks

METRIC_COLUMNS = ["epoch", "phase", "dendrites", "val_score", "running_score", "test_score",
                  "lr", "params", "seconds", "event"]
ARCH_COLUMNS = ["dendrites", "params", "best_val_score", "test_score", "epoch"]
TEXT_COLUMNS = ("phase", "event", "reason")  # kept as text when metrics.csv is read back
_INT = re.compile(r"[+-]?\d+")

log = logging.getLogger("perfora")


def _fmt(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return value


class RunReport:
    """Writes the tables and graph of one run under ``run_dir`` (rank 0 only).

    Opening the folder removes temp files that killed writes left there. Every file is
    written as a temp file renamed over the target, or appended to without following a
    symlink, so a symlink planted in the folder never redirects a write."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._columns: list[str] | None = None
        self.removed_temp_files = remove_stale_temp_files(self.run_dir)

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.csv"

    def resume_history(self, saved: Sequence[Mapping[str, Any]], epoch: int,
                       source: Path | None = None) -> list[dict[str, Any]]:
        """The full history of a run resumed at ``epoch``, also written to metrics.csv.

        A checkpoint keeps only its newest rows (``saved``; all of them in files of older
        versions); the earlier ones are read back from metrics.csv (``source``: the one
        next to the checkpoint; default this run's), rows after ``epoch`` dropped. If
        that file is missing or belongs to another run, the history starts at the saved
        rows (logged)."""
        history = [*self._earlier_rows(saved, epoch, source), *map(dict, saved)]
        self._keep_later_rows(epoch)
        self.rewrite_metrics(history)
        return history

    def _keep_later_rows(self, epoch: int) -> None:
        """Before metrics.csv is cut back to ``epoch`` (a resume from ``best`` or a
        ``switch_N``), copy it whole to ``metrics.until-epoch-N.csv``: the rows of the run
        after the checkpoint are what its user compares the resumed run with."""
        rows = read_metrics(self.metrics_path)
        last = max((r["epoch"] for r in rows or ()), default=0)
        if last <= epoch:
            return
        kept = self.run_dir / f"metrics.until-epoch-{last}.csv"
        kept.write_bytes(self.metrics_path.read_bytes())
        log.warning("perfora: resumed at epoch %d of a run that had reached epoch %d: "
                    "metrics.csv now ends at epoch %d; the rows up to epoch %d are kept in %s",
                    epoch, last, epoch, last, kept.name)

    def _earlier_rows(self, saved: Sequence[Mapping[str, Any]], epoch: int,
                      source: Path | None) -> list[dict[str, Any]]:
        """The rows of metrics.csv before the first saved row, if they belong to this run:
        the file must hold the first saved row itself (same epoch, dendrites and score)."""
        first = saved[0] if saved else None
        start = first["epoch"] if first is not None else epoch + 1
        if start <= 1:
            return []
        source = source if source is not None else self.metrics_path
        rows = read_metrics(source)
        if rows is None:
            log.warning("perfora: %s could not be read; metrics.csv of the resumed run starts "
                        "at epoch %d", source, start)
            return []
        if first is not None:
            match = [r for r in rows if r["epoch"] == start]
            if not match or any(match[0].get(k) != first.get(k)
                                for k in ("dendrites", "val_score")):
                log.warning("perfora: %s does not hold the checkpoint's epoch %d (another "
                            "run's?); metrics.csv of the resumed run starts there", source,
                            start)
                return []
        return [r for r in rows if r["epoch"] < start]

    def rewrite_metrics(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Write metrics.csv anew from the whole history (after a load: columns may differ)."""
        self._columns = None
        self.write_metrics(history)

    def write_metrics(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Append the last row, or rewrite the file when the columns changed (or on resume)."""
        if not history:
            return
        if self._columns is None or not self.metrics_path.exists():
            columns = list(METRIC_COLUMNS)
            for row in history:
                columns += [k for k in row if k not in columns]
        else:  # only the new row can add a column: O(1) per epoch, not O(epochs)
            columns = self._columns + [k for k in history[-1] if k not in self._columns]
        if columns == self._columns and self.metrics_path.exists():
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
            writer.writerow({k: _fmt(history[-1].get(k)) for k in columns})
            if append_text(self.metrics_path, buf.getvalue()):
                return
            # not a regular file any more (a symlink was planted): rewrite it in place of
            # the link, never through it
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in history:
            writer.writerow({k: _fmt(row.get(k)) for k in columns})
        atomic_write_text(self.metrics_path, buf.getvalue())
        self._columns = columns

    def write_arch_table(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """best_arch_scores.csv: one row per architecture (dendrite count)."""
        buf = io.StringIO()
        columns = ARCH_COLUMNS + (["widenings"] if any("widenings" in r for r in rows) else [])
        writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row.get(k, 0 if k == "widenings" else None))
                             for k in columns})
        atomic_write_text(self.run_dir / "best_arch_scores.csv", buf.getvalue())

    def write_run_json(self, info: Mapping[str, Any]) -> None:
        """run.json: versions and settings of the run."""
        atomic_write_text(self.run_dir / "run.json", json.dumps(info, indent=2, default=str))

    def draw_history(self, history: Sequence[Mapping[str, Any]],
                     switch_epochs: Sequence[int], maximize: bool,
                     kinds: Sequence[str] = ()) -> None:
        """history.png: scores with phase changes marked, learning rate, params, epoch time."""
        if not history:
            return
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure

        rule_keys = sorted({k for r in history for k in r if k.startswith("rule/")})
        fig = Figure(figsize=(16 if rule_keys else 11, 7), dpi=90)
        axes = fig.subplots(2, 3 if rule_keys else 2)
        epochs = [r["epoch"] for r in history]

        def series(key: str) -> list[float]:
            return [float("nan") if r.get(key) is None else float(r[key]) for r in history]

        ax = axes[0][0]
        ax.plot(epochs, series("val_score"), label="validation", lw=1.2)
        if any(r.get("running_score") != r.get("val_score") for r in history):
            ax.plot(epochs, series("running_score"), label="validation (smoothed)", lw=1)
        if any(r.get("test_score") is not None for r in history):
            ax.plot(epochs, series("test_score"), label="test", lw=1)
        extra_keys = [k for k in history[-1] if k.startswith("extra/")]
        for key in extra_keys:
            ax.plot(epochs, series(key), label=key[6:], lw=0.8, alpha=0.8)
        _mark_growth(ax, history_marks(history, switch_epochs, kinds))
        phase_changes = [r["epoch"] for r in history if r.get("event") == "phase_change"]
        for i, e in enumerate(phase_changes):
            ax.axvline(e + 0.5, color="tab:blue", ls=":", lw=0.8,
                       label="phase change" if i == 0 else None)
        ax.set_title(f"scores ({'higher' if maximize else 'lower'} is better)")
        ax.set_xlabel("epoch")
        ax.legend(fontsize=7)

        axes[0][1].plot(epochs, series("lr"), color="tab:green")
        axes[0][1].set_title("learning rate")
        axes[1][0].plot(epochs, series("params"), color="tab:purple")
        axes[1][0].set_title("parameters")
        axes[1][1].plot(epochs, series("seconds"), color="tab:gray")
        axes[1][1].set_title("epoch time (s)")
        if rule_keys:
            panel = axes[0][2]
            for key in rule_keys:
                panel.plot(epochs, series(key), marker=".", lw=0.8, label=key[5:])
            panel.set_title("correlation (dendrite phases)")
            panel.legend(fontsize=7)
            axes[1][2].axis("off")
        for a in (axes[0][1], axes[1][0], axes[1][1]):
            a.set_xlabel("epoch")
        # fixed margins: tight_layout measures every label (about a quarter of the drawing)
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.08, top=0.95, wspace=0.2,
                            hspace=0.35)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        atomic_write_bytes(self.run_dir / "history.png", buf.getvalue())


_STEP_STYLE = {"dendrites": ("tab:red", "--", "dendrite set added"),
               "neurons": ("tab:orange", "-.", "neurons added")}


def _mark_growth(ax: Any, marks: HistoryMarks) -> None:
    """Each growth step as a line styled by its kind (faded when a rewind undid it), and the
    epochs a rewind to the best model undid as grey spans."""
    labelled: set[str] = set()

    def label(text: str) -> str | None:
        if text in labelled:
            return None
        labelled.add(text)
        return text

    merged: list[list[int]] = []  # overlapping spans drawn once (no darker overlaps)
    for best, at in sorted(marks.undone_spans):
        if merged and best <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], at)
        else:
            merged.append([best, at])
    for best, at in merged:
        ax.axvspan(best + 0.5, at + 0.5, color="0.6", alpha=0.2, lw=0,
                   label=label("undone (back to the best model)"))
    for step in marks.steps:
        color, style, text = _STEP_STYLE[step.kind]
        ax.axvline(step.epoch + 0.5, color=color, ls=style, lw=0.8,
                   alpha=0.5 if step.undone else 1.0,
                   label=label(f"{text}, undone" if step.undone else text))


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]] | None:
    """The rows of a metrics.csv as the controller recorded them (numbers as numbers, empty
    cells as None, or left out for columns a row did not have); None when the file is
    missing, not a regular file, or malformed."""
    text = _read_regular_file(path)
    if text is None:
        return None
    rows = []
    try:
        for raw in csv.DictReader(io.StringIO(text, newline="")):
            row = _parse_row(raw)
            if row is None:
                return None
            rows.append(row)
    except csv.Error:
        return None
    return rows


def _parse_row(raw: Mapping[str | None, Any]) -> dict[str, Any] | None:
    """One row read back (None when malformed: cells beyond the header, no integer epoch)."""
    row: dict[str, Any] = {}
    for key, text in raw.items():
        if key is None or text is None:
            return None
        if key in TEXT_COLUMNS:
            row[key] = text
        elif text != "":
            row[key] = _number(text)
        elif key in METRIC_COLUMNS:
            row[key] = None
    return row if isinstance(row.get("epoch"), int) else None


def _number(text: str) -> Any:
    """An int or float as :func:`_fmt` wrote it (``repr`` round-trips exactly); other text
    stays text."""
    if _INT.fullmatch(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def _read_regular_file(path: str | os.PathLike) -> str | None:
    """The text of a regular file, never through a symlink or from a FIFO; None otherwise."""
    flags = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
             | getattr(os, "O_CLOEXEC", 0))
    if not hasattr(os, "O_NOFOLLOW") and os.path.islink(path):
        return None
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            return handle.read().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None
