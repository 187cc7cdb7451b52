"""Width-curve benchmark: add dendrites, or just widen the network?

Every dendrite arm is compared with the *same* plain network at several widths, trained the
same way, at the arm's own parameter count.

Method. Each task gives train/val/test tensors and a model builder taking a width (hidden
units, or channels for the CNN). The **width curve** trains the plain network at 6 widths
(``WIDTH_MULTIPLIERS`` times the task's narrow start width) with perfora's controller and
``max_dendrites=0``, i.e. pure early stopping. Each **arm** (``ARMS``: PerforaConfig overrides)
grows dendrites on the start-width network. All runs share the optimizer (Adam, lr 0.01,
rebuilt after every restructure), batch size, patience, improvement threshold and epoch cap;
the controller sees the validation loss, and a run's score is the test accuracy at its best
validation epoch. Per task, arm and curve point: median and quartiles of that accuracy over
seeds, median parameter count. An arm's ``vs_curve`` is its median minus the curve's median
accuracy at the arm's median parameter count (linear in log(params) between curve points;
"beyond" when outside the curve's range, clamped to the end point); ``vs_start`` is its
median minus the start width's (the 1x curve point). Both in accuracy points (x100).

Tasks (start width; batch):

- ``digits``, ``wine``, ``breast_cancer``: scikit-learn, stratified 60/20/20 split per
  seed, standardized; tanh MLP with one hidden layer (8, 4, 4; batch 32).
- ``spirals``: two spirals, tanh MLP with two hidden layers (8; batch 32); patience and
  epoch cap x5 (it needs long training).
- ``mnist1d``: 4000 train (3200/800 train/val per seed) and 1000 test sequences of length
  40 from ``mnist1d`` (generated offline); ReLU MLP with one hidden layer (16; batch 128).
- ``digits_cnn``: the 8x8 digits images, conv(3x3)-ReLU-maxpool-conv(3x3)-ReLU-linear; the
  width is the channel count (4; batch 32).

Caps: ``--quick`` 3 seeds, patience 8, max_dendrites 2, epoch cap 150; full 5 seeds,
patience 10, max_dendrites 4, epoch cap 2000 (spirals: patience and cap x5 in both).

    python benchmarks/quality.py --quick                 # ~3.5 min with --jobs 2 (2 cores)
    python benchmarks/quality.py                         # full run, ~12 min
    python benchmarks/quality.py --datasets wine digits --arms gd --seeds 2
    python benchmarks/quality.py --arms custom --set rule=correlation --set activation=tanh
    python benchmarks/quality.py --quick --no-curve --out-dir /tmp/q   # arms only

Outputs: markdown tables on stdout, progress on stderr, JSON (``quality.json`` or
``quality_quick.json``; ``--json`` overrides) and ``pareto_<task>.png``
(``pareto_<task>_quick.png`` for ``--quick``) in ``results/local/`` (git-ignored), or in the
stored ``results/`` with ``--update-stored``; ``--out-dir`` redirects both.

``--quick`` is a smoke run of the script, not a smaller benchmark: with 3 seeds, at most 2
sets and 150 epochs its numbers differ from the full run's (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import output_paths
import torch
from torch import nn

from perfora import ConfigError, GrowthController, PerforaConfig, perforate

Split = tuple[torch.Tensor, torch.Tensor]

ARMS: dict[str, dict[str, Any]] = {
    # perfora 0.1's default and rule (PerforatedAI's growth: every neuron, random init, a
    # failed set discarded and retried)
    "gd": {"rule": "gd", "dendrite_init": "default", "grow_fraction": 1.0,
           "retain_all_dendrites": False},
    "correlation": {"rule": "correlation", "dendrite_init": "default", "grow_fraction": 1.0,
                    "retain_all_dendrites": False},
    # the variants tried for "growth that spends parameters where they pay"
    "error_init": {"dendrite_init": "error", "grow_fraction": 1.0,
                   "retain_all_dendrites": False},
    "selective": {"dendrite_init": "error", "grow_fraction": 0.5,
                  "retain_all_dendrites": False},
    "selective_random": {"dendrite_init": "default", "grow_fraction": 0.5,
                         "retain_all_dendrites": False},
    "selective_retain": {"dendrite_init": "error", "grow_fraction": 0.5,
                         "retain_all_dendrites": True},
    "relu_error_retain": {"dendrite_init": "error", "grow_fraction": 1.0,
                          "retain_all_dendrites": True, "activation": "relu"},
    "output_layer_only": {"dendrite_init": "error", "output_only": True},
    # "grow until the training set is learned" (two spirals): the controller sees the
    # training accuracy (or loss) and stops growing at the target
    "learn_train_acc": {"score": "train_accuracy", "maximize": True, "max_dendrites": 20,
                        "target_score": 1.0, "tasks": ["spirals"]},
    "learn_train_loss": {"score": "train_loss", "max_dendrites": 20, "target_score": 0.01,
                         "tasks": ["spirals"]},
    # PerforaConfig's defaults, what perforate() + GrowthController give: dendrite_init
    # "error", grow_fraction 1.0, retain_all_dendrites True
    "default": {},
}
"""Dendrite arms: name -> PerforaConfig overrides, applied on top of the harness settings.
Two keys are the harness's own: ``score`` ("val_loss", the default, or "train_accuracy": the
score the controller sees) and ``tasks`` (run the arm on these tasks only)."""

HARNESS_KEYS = ("score", "tasks", "output_only")

WIDTH_MULTIPLIERS: tuple[float, ...] = (1, 1.5, 2, 3, 4, 6)
"""Curve widths as multiples of the start width; 6x covers what 4 dendrite sets reach."""

CURVE: tuple[tuple[str, Any], ...] = (("max_dendrites", 0),)
"""Overrides of the width curve's runs: no dendrites, i.e. plain early stopping."""



# --------------------------------------------------------------------------- tasks
@dataclass
class Task:
    """One benchmark problem: data splits, a model builder and how to train it."""

    name: str
    splits: dict[str, Split]
    build: Callable[[int], nn.Module]
    """Model of a given width (hidden units, or channels)."""
    width: int
    """Narrow start width: the 1x curve point and the network the arms grow."""
    scale: int = 1
    """Patience and epoch cap multiplier (two spirals needs long training)."""
    batch: int = 32


def _tensors(parts: dict[str, tuple[np.ndarray, np.ndarray]], mean: Any, std: Any,
             ) -> dict[str, Split]:
    return {k: (torch.tensor((a - mean) / std, dtype=torch.float32), torch.tensor(b))
            for k, (a, b) in parts.items()}


def _split_sklearn(loader: Callable, seed: int, per_feature: bool = True) -> dict[str, Split]:
    """Stratified 60/20/20 split, standardized with the training statistics (per feature, or
    one scalar for images); a feature constant in training keeps scale 1 (no 1e8 blow-ups)."""
    from sklearn.model_selection import train_test_split

    x, y = loader(return_X_y=True)
    x_tr, x_rest, y_tr, y_rest = train_test_split(x, y, test_size=0.4, stratify=y,
                                                  random_state=seed)
    x_va, x_te, y_va, y_te = train_test_split(x_rest, y_rest, test_size=0.5, stratify=y_rest,
                                              random_state=seed)
    if per_feature:
        mean, std = x_tr.mean(0), x_tr.std(0)
        std[std == 0] = 1.0
    else:
        mean, std = x_tr.mean(), x_tr.std()
    return _tensors({"train": (x_tr, y_tr), "val": (x_va, y_va), "test": (x_te, y_te)},
                    mean, std)


def mlp(inputs: int, width: int, depth: int, classes: int,
        act: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """``depth`` hidden layers of ``width`` units."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(inputs, width), act()]
        inputs = width
    return nn.Sequential(*layers, nn.Linear(inputs, classes))


def cnn(channels: int, classes: int = 10) -> nn.Sequential:
    """Tiny CNN for 8x8 images: two 3x3 convs of ``channels`` channels, one max-pool."""
    c = channels
    return nn.Sequential(nn.Conv2d(1, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(c * 16, classes))


def _sklearn_task(name: str, loader: Callable, width: int, seed: int) -> Task:
    splits = _split_sklearn(loader, seed)
    inputs, classes = splits["train"][0].shape[1], int(splits["train"][1].max()) + 1
    return Task(name, splits, lambda w: mlp(inputs, w, 1, classes), width)


def digits(seed: int) -> Task:
    from sklearn.datasets import load_digits
    return _sklearn_task("digits", load_digits, 8, seed)


def wine(seed: int) -> Task:
    from sklearn.datasets import load_wine
    return _sklearn_task("wine", load_wine, 4, seed)


def breast_cancer(seed: int) -> Task:
    from sklearn.datasets import load_breast_cancer
    return _sklearn_task("breast_cancer", load_breast_cancer, 4, seed)


def two_spirals(offset: float) -> Split:
    """Lang & Witbrock's two spirals (97 points per class); ``offset`` shifts the angles."""
    i = np.arange(97) + offset
    angle = i * math.pi / 16
    radius = 6.5 * (104 - i) / 104
    a = np.stack([radius * np.sin(angle), radius * np.cos(angle)], 1)
    x = np.concatenate([a, -a]) * (3 / 6.5)  # radius <= 3: tanh units resolve the turns
    y = np.concatenate([np.zeros(97), np.ones(97)]).astype(np.int64)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def spirals(seed: int) -> Task:
    """Train on the classic 194 points; validate and test on points halfway between (the
    data do not depend on the seed, only the initialization and batch order do)."""
    x_mid, y_mid = two_spirals(0.5)
    splits = {"train": two_spirals(0.0), "val": (x_mid[::2], y_mid[::2]),
              "test": (x_mid[1::2], y_mid[1::2])}
    return Task("spirals", splits, lambda w: mlp(2, w, 2, 2), 8, scale=5)


@functools.lru_cache(maxsize=1)
def _mnist1d_raw() -> dict[str, np.ndarray]:
    """The default MNIST-1D dataset (deterministic, ~1 s to generate; cached per process)."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as exc:
        raise SystemExit("the mnist1d task needs the mnist1d package: pip install -e "
                         "'.[bench]' (or leave it out: --datasets digits wine ...)") from exc

    return make_dataset(get_dataset_args())


def mnist1d(seed: int) -> Task:
    """3200/800 train/val by a seeded permutation of the 4000 training sequences; the 1000
    test sequences as test; standardized with the training statistics."""
    raw = _mnist1d_raw()
    perm = np.random.default_rng(seed).permutation(len(raw["x"]))
    tr, va = perm[:3200], perm[3200:]
    x, y = raw["x"], raw["y"]
    mean, std = x[tr].mean(0), x[tr].std(0)
    splits = _tensors({"train": (x[tr], y[tr]), "val": (x[va], y[va]),
                       "test": (raw["x_test"], raw["y_test"])}, mean, std)
    return Task("mnist1d", splits, lambda w: mlp(40, w, 1, 10, nn.ReLU), 16, batch=128)


def digits_cnn(seed: int) -> Task:
    """The digits split of the same seed, as (N, 1, 8, 8) images, one scalar standardization."""
    from sklearn.datasets import load_digits

    splits = {k: (x.reshape(-1, 1, 8, 8), y)
              for k, (x, y) in _split_sklearn(load_digits, seed, per_feature=False).items()}
    return Task("digits_cnn", splits, cnn, 4)


TASKS: dict[str, Callable[[int], Task]] = {
    "digits": digits, "wine": wine, "breast_cancer": breast_cancer, "spirals": spirals,
    "mnist1d": mnist1d, "digits_cnn": digits_cnn}

COST = {"mnist1d": 4, "digits_cnn": 4, "digits": 2, "spirals": 2, "wine": 1,
        "breast_cancer": 1}
"""Rough relative run cost, to start the long runs first (better packing across jobs)."""


@functools.lru_cache(maxsize=8)
def load_task(name: str, seed: int) -> Task:
    """The task's data for one seed (cached: a worker reuses it across widths and arms)."""
    return TASKS[name](seed)


def curve_widths(start: int) -> list[int]:
    return sorted({max(1, round(start * m)) for m in WIDTH_MULTIPLIERS})


# ------------------------------------------------------------------------ training
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(cross-entropy loss, accuracy)."""
    model.eval()
    with torch.no_grad():
        out = model(x)
        return (nn.functional.cross_entropy(out, y).item(),
                (out.argmax(1) == y).float().mean().item())


def train_epoch(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor, gen: torch.Generator, batch: int) -> None:
    model.train()
    order = torch.randperm(len(x), generator=gen)
    for i in range(0, len(x), batch):
        idx = order[i:i + batch]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()


@dataclass
class Setup:
    """Training shared by every run (scaled per task by ``Task.scale``)."""

    patience: int
    max_dendrites: int
    max_epochs: int
    lr: float = 0.01
    improvement_threshold: float = 1e-3


def make_config(setup: Setup, scale: int, seed: int, overrides: dict[str, Any]) -> PerforaConfig:
    """Harness settings, then the arm's overrides (which win)."""
    base: dict[str, Any] = {
        "maximize": False, "n_epochs_to_switch": setup.patience * scale,
        "improvement_threshold": setup.improvement_threshold, "seed": seed,
        "save_checkpoints": False, "max_dendrites": setup.max_dendrites}
    return PerforaConfig(**{**base, **overrides})


def run_controller(task: Task, width: int, seed: int, setup: Setup,
                   overrides: dict[str, Any]) -> dict[str, Any]:
    """One controller-driven run of the ``width`` network; score, params, epochs, seconds."""
    torch.manual_seed(seed)
    x, y = task.splits["train"]
    score_name = overrides.pop("score", "val_loss")
    overrides.pop("tasks", None)
    output_only = overrides.pop("output_only", False)
    if score_name not in ("val_loss", "train_loss"):
        overrides.setdefault("maximize", True)
    config = make_config(setup, task.scale, seed, overrides)
    net = task.build(width)
    last = [name for name, m in net.named_modules() if isinstance(m, nn.Linear)][-1]
    # the controller applies config.activation
    model = perforate(net, paths=[last]) if output_only else perforate(net)
    ctl = GrowthController(model, config, write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=setup.lr)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(setup.max_epochs * task.scale):
        train_epoch(model, opt, x, y, gen, task.batch)
        val_loss, val_acc = evaluate(model, *task.splits["val"])
        _, test_acc = evaluate(model, *task.splits["test"])
        if score_name in ("train_accuracy", "train_loss"):
            train_loss, train_acc = evaluate(model, x, y)
            score = train_acc if score_name == "train_accuracy" else train_loss
        else:
            score = val_acc if score_name == "val_accuracy" else val_loss
        decision = ctl.step(score, test_score=test_acc)
        if decision.complete:
            break
        if decision.restructured:
            opt = decision.optimizer
    seconds = time.perf_counter() - start
    params, dendrites = ctl.parameter_count(), ctl.num_dendrites
    if not ctl.completed and ctl.best_snapshot is not None:
        # stopped by the epoch cap: score and size are the best checkpoint's, which may lack
        # a dendrite set still on trial in the live model
        structure, tensors = ctl.best_snapshot
        names = {name for name, _ in model.named_parameters()}
        params = sum(t.numel() for name, t in tensors.items() if name in names)
        dendrites = max((s["num_dendrites"] for s in structure.values()), default=0)
    return {"test": ctl.state.best_test, "params": params, "dendrites": dendrites,
            "epochs": ctl.epoch, "capped": not ctl.completed, "seconds": seconds}


@dataclass(frozen=True)
class Job:
    """One independent run: a curve width (``arm`` None) or an arm on the start width."""

    task: str
    seed: int
    width: int
    arm: str | None
    overrides: tuple[tuple[str, Any], ...]
    setup: Setup

    @property
    def name(self) -> str:
        return self.arm if self.arm is not None else f"width {self.width}"


def _frozen(overrides: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Hashable overrides (lists become tuples) for a Job."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                        for k, v in overrides.items()))


def run_job(job: Job) -> dict[str, Any]:
    """Run one job; seeded by itself, so results do not depend on the pool or its order."""
    task = load_task(job.task, job.seed)
    row = {"task": job.task, "seed": job.seed, "kind": "curve" if job.arm is None else "arm",
           "name": job.name, "width": job.width}
    return {**row, **run_controller(task, job.width, job.seed, job.setup, dict(job.overrides))}


def _worker_init() -> None:
    torch.set_num_threads(1)


def _run_indexed(item: tuple[int, Job]) -> tuple[int, dict[str, Any]]:
    return item[0], run_job(item[1])


def run_all(jobs: list[Job], n_jobs: int) -> list[dict[str, Any]]:
    """Run every job (in a process pool when ``n_jobs`` > 1), printing progress to stderr."""
    order = sorted(enumerate(jobs),
                   key=lambda ij: (-COST.get(ij[1].task, 1) * (3 if ij[1].arm else 1), ij[1].task))
    done: dict[int, dict[str, Any]] = {}

    def report(index: int, row: dict[str, Any]) -> None:
        done[index] = row
        print(f"[{len(done)}/{len(jobs)}] {row['task']} seed {row['seed']} {row['name']}: "
              f"acc {row['test']:.3f}, {row['params']} params, {row['dendrites']} dendrites, "
              f"{row['epochs']} epochs, {row['seconds']:.1f} s", file=sys.stderr, flush=True)

    if n_jobs <= 1:
        _worker_init()
        for item in order:
            report(*_run_indexed(item))
    else:
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        with mp.get_context(method).Pool(n_jobs, initializer=_worker_init) as pool:
            for index, row in pool.imap_unordered(_run_indexed, order):
                report(index, row)
    return [done[i] for i in range(len(jobs))]


# ---------------------------------------------------------------------- statistics
def _stats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    acc = [r["test"] for r in runs]
    q25, med, q75 = np.percentile(acc, [25, 50, 75]).tolist()
    params = [r["params"] for r in runs]
    p25, pmed, p75 = np.percentile(params, [25, 50, 75]).tolist()
    return {"runs": len(runs), "median": med, "q25": q25, "q75": q75, "params": pmed,
            "params_q25": p25, "params_q75": p75,
            "dendrites": float(np.median([r["dendrites"] for r in runs])),
            "kept": sum(r["dendrites"] > 0 for r in runs),
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


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: curve points and arms with their statistics and comparisons."""
    out: dict[str, dict[str, Any]] = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        curve = []
        for width in sorted({r["width"] for r in mine if r["kind"] == "curve"}):
            runs = [r for r in mine if r["kind"] == "curve" and r["width"] == width]
            curve.append({"name": f"width {width}", "width": width, **_stats(runs)})
        arm_widths = [r["width"] for r in mine if r["kind"] == "arm"]
        start = arm_widths[0] if arm_widths else min((p["width"] for p in curve), default=None)
        start_point = next((p for p in curve if p["width"] == start), None)
        arms = []
        for name in dict.fromkeys(r["name"] for r in mine if r["kind"] == "arm"):
            arm = {"name": name, **_stats([r for r in mine if r["name"] == name])}
            if curve:
                at, beyond = curve_at(curve, arm["params"])
                arm.update(curve_acc=at, beyond_curve=beyond,
                           vs_curve=100 * (arm["median"] - at))
            if start_point is not None:
                arm["vs_start"] = 100 * (arm["median"] - start_point["median"])
            arms.append(arm)
        out[task] = {"start_width": start, "curve": curve, "arms": arms}
    return out


# ------------------------------------------------------------------------- output
def _fmt(value: float | None, spec: str = "+.1f") -> str:
    return "" if value is None else format(value, spec)


def task_table(name: str, summary: dict[str, Any]) -> str:
    """Markdown: curve widths then arms (accuracies in %, comparisons in points)."""
    lines = [f"### {name} (start width {summary['start_width']})", "",
             "| run | params | median | q25 | q75 | dendrites | epochs | s | vs_curve "
             "| vs_start |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in summary["curve"] + summary["arms"]:
        beyond = " (beyond)" if row.get("beyond_curve") else ""
        lines.append(
            f"| {row['name']} | {row['params']:.0f} | {100 * row['median']:.1f} | "
            f"{100 * row['q25']:.1f} | {100 * row['q75']:.1f} | {row['dendrites']:g} | "
            f"{row['epochs']:g} | {row['seconds']:.1f} | {_fmt(row.get('vs_curve'))}{beyond} | "
            f"{_fmt(row.get('vs_start'))} |")
    return "\n".join(lines)


def summary_rows(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Task x arm: vs_curve, vs_start, and whether the arm reaches the width curve."""
    rows = []
    for task, summary in summaries.items():
        for arm in summary["arms"]:
            vs = arm.get("vs_curve")
            start = arm.get("vs_start")
            rows.append({"task": task, "arm": arm["name"], "params": arm["params"],
                         "dendrites": arm["dendrites"], "kept": arm["kept"],
                         "runs": arm["runs"], "vs_curve": vs, "vs_start": start,
                         "beyond_curve": arm.get("beyond_curve"),
                         "reaches_curve": None if vs is None else vs >= 0,
                         # the target: at or above the curve with dendrites kept (median)
                         # and at least 1 point above the start
                         "counts": None if vs is None or start is None else bool(
                             vs >= 0 and arm["dendrites"] >= 1 and start >= 1)})
    return rows


def summary_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| task | arm | params | dendrites (median) | runs that kept any | vs_curve "
             "| vs_start | reaches curve | counts |", "|---|---|---|---|---|---|---|---|---|"]

    def yes(flag: bool | None) -> str:
        return "" if flag is None else ("yes" if flag else "no")

    for r in rows:
        beyond = " (beyond)" if r["beyond_curve"] else ""
        lines.append(f"| {r['task']} | {r['arm']} | {r['params']:.0f} | {r['dendrites']:g} | "
                     f"{r['kept']}/{r['runs']} | {_fmt(r['vs_curve'])}{beyond} | "
                     f"{_fmt(r['vs_start'])} | {yes(r['reaches_curve'])} | "
                     f"{yes(r['counts'])} |")
    return "\n".join(lines)


def plot(name: str, summary: dict[str, Any], path: Path) -> None:
    """Test accuracy vs parameters (log x): width curve with quartile band, arms as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.0, 4.6))
    curve = summary["curve"]
    if curve:
        p = [c["params"] for c in curve]
        ax.plot(p, [100 * c["median"] for c in curve], "o-", color="0.3",
                label="plain network, widths " + ", ".join(str(c["width"]) for c in curve))
        ax.fill_between(p, [100 * c["q25"] for c in curve], [100 * c["q75"] for c in curve],
                        color="0.3", alpha=0.15, linewidth=0)
    markers = "sD^vP*Xhp<>d"
    colors = plt.get_cmap("tab20").colors
    for i, arm in enumerate(summary["arms"]):
        y, x = 100 * arm["median"], arm["params"]
        ax.errorbar(x, y, yerr=[[y - 100 * arm["q25"]], [100 * arm["q75"] - y]],
                    xerr=[[x - arm["params_q25"]], [arm["params_q75"] - x]],
                    fmt=markers[i % len(markers)], ms=10 - 2 * (i % 3), capsize=3,
                    color="black" if arm["name"] == "default" else colors[(2 * i) % 20],
                    label=f"{arm['name']} ({arm['dendrites']:g} dendrites)")
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("test accuracy (%)")
    runs = max((c["runs"] for c in curve + summary["arms"]), default=0)
    ax.set_title(f"{name}: dendrites vs a wider network\n(median and quartiles over {runs} "
                 "seeds; markers: dendrite arms)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI
def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds, short caps")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5)")
    parser.add_argument("--datasets", nargs="+", choices=list(TASKS), default=None,
                        metavar="TASK", help=f"subset of tasks: {', '.join(TASKS)}")
    parser.add_argument("--arms", nargs="+", default=None, metavar="NAME",
                        help=f"subset of arms: {', '.join(ARMS)} (and custom with --set)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="define arm 'custom' (PerforaConfig overrides, JSON values)")
    parser.add_argument("--no-curve", action="store_true", help="skip the width curve")
    parser.add_argument("--jobs", type=int, default=2, help="parallel runs (default 2)")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="for JSON and PNGs (default benchmarks/results/local/; with "
                             "--update-stored benchmarks/results/)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write results (default OUT_DIR/quality.json, "
                             "quality_quick.json for --quick)")
    output_paths.add_update_stored(parser)
    parser.add_argument("--summarize", type=Path, default=None, metavar="JSON",
                        help="no runs: redo the tables, plots and summary of a saved JSON "
                             "(written to OUT_DIR under the same name)")
    return parser


def out_dir(args: argparse.Namespace) -> Path:
    """The folder of the plots (and of the JSON without --json)."""
    return args.out_dir or output_paths.results_dir(args.update_stored)


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --json, else in :func:`out_dir`."""
    if args.json:
        return args.json
    if args.summarize is not None:
        return out_dir(args) / args.summarize.name
    return out_dir(args) / ("quality_quick.json" if args.quick else "quality.json")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the tables, write the JSON and the plots."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.summarize is not None:
        saved = json.loads(args.summarize.read_text())
        report(saved["runs"], saved["setup"], saved["total_seconds"], out_dir(args),
               output_path(args))
        return 0

    arms = dict(ARMS)
    if args.set:
        custom = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep or not key:
                parser.error(f"--set {item!r}: expected NAME=VALUE")
            custom[key] = _parse_value(value)
        arms["custom"] = custom
    selected = args.arms if args.arms is not None else list(arms)
    for name in selected:
        if name not in arms:
            parser.error(f"unknown arm {name!r}; known: {', '.join(arms)}")
    if args.quick:
        setup = Setup(patience=8, max_dendrites=2, max_epochs=150)
    else:
        setup = Setup(patience=10, max_dendrites=4, max_epochs=2000)
    for name in selected:  # a bad override fails here, not in a worker
        try:
            make_config(setup, 1, 0, {k: v for k, v in arms[name].items()
                                      if k not in HARNESS_KEYS})
        except (ConfigError, TypeError, ValueError) as exc:  # TypeError: unknown setting
            parser.error(f"arm {name!r}: {exc}")
    seeds = list(range(args.seeds or (3 if args.quick else 5)))
    tasks = args.datasets or list(TASKS)

    jobs = []
    for task in tasks:
        start = load_task(task, 0).width  # cheap; forked workers inherit the cache
        for seed in seeds:
            if not args.no_curve:
                jobs += [Job(task, seed, w, None, CURVE, setup) for w in curve_widths(start)]
            jobs += [Job(task, seed, start, name, _frozen(arms[name]), setup)
                     for name in selected if task in arms[name].get("tasks", [task])]
    began = time.perf_counter()
    rows = run_all(jobs, args.jobs)
    total = time.perf_counter() - began

    setup_info = {**asdict(setup), "seeds": seeds, "quick": args.quick,
                  "width_multipliers": list(WIDTH_MULTIPLIERS),
                  "arms": {name: arms[name] for name in selected}, "curve": not args.no_curve,
                  "jobs": args.jobs, "torch": torch.__version__, "runs": len(jobs)}
    report(rows, setup_info, total, out_dir(args), output_path(args))
    return 0


def report(rows: list[dict[str, Any]], setup: dict[str, Any], total: float, out_dir: Path,
           out: Path) -> None:
    """Print the tables, draw the plots and write the JSON of a finished set of runs."""
    summaries = summarize(rows)
    for name, summary in summaries.items():
        print(task_table(name, summary) + "\n")
    overview = summary_rows(summaries)
    print("### summary (points of test accuracy; vs_curve: arm minus the width curve at the "
          "arm's params; counts: at or above the curve, dendrites kept in the median run, "
          "and at least 1 point above the start)\n")
    print(summary_table(overview))
    print(f"\n{len(setup['seeds'])} seed(s), patience {setup['patience']}, max_dendrites "
          f"{setup['max_dendrites']}, epoch cap {setup['max_epochs']} (spirals: patience and "
          f"cap x5); {len(rows)} runs, {setup['jobs']} job(s); total {total:.0f} s")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, summary in summaries.items():
        # quick runs draw beside the full run's plots, never over them
        suffix = "_quick" if setup.get("quick") else ""
        plot(name, summary, out_dir / f"pareto_{name}{suffix}.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"setup": setup, "total_seconds": total, "summary": overview,
                               "tasks": summaries, "runs": rows}, indent=1))
    print(f"\nwrote {out} and the plots in {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
