"""Per-epoch cost of perfora's own calls on the digits MLP, native and compat.

A small MLP (64-32-10) trains on scikit-learn's ``load_digits`` for N epochs (default 200)
with a run folder, default settings (``checkpoint_time_budget`` 5%) and no growth (the
plateau patience is longer than the run), so every epoch is a plain one. Per epoch it times
only the perfora calls -- native: ``controller.step(score)``; compat: PerforatedAI's
tracker calls ``add_extra_score``, ``add_test_score`` and ``add_validation_score`` -- with the
training epoch (train + validation) beside it. Reported: median and p90 cost per epoch (ms),
the median over epochs that wrote no checkpoint, the cost as a fraction of the epoch, how
many epochs wrote ``latest``, and the checkpoint JSON size at epoch 10 and at the last epoch
(it must not grow with the epochs).

    python benchmarks/epoch_cost.py [--epochs 200] [--json PATH] [--update-stored]

Writes benchmarks/results/local/epoch_cost.json (git-ignored); ``--update-stored`` writes the
stored benchmarks/results/epoch_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import output_paths
import torch
from torch import nn

import perfora
from perfora.compat import globals_perforatedai as GPA
from perfora.compat import utils_perforatedai as UPA

BATCH = 64
PATIENCE = 10**6  # no growth: every epoch is a plain one


def digits() -> tuple[torch.Tensor, ...]:
    """load_digits, scaled to [0, 1]; 1400 rows to train, the rest to validate."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    x = torch.tensor(x, dtype=torch.float32)[order] / 16.0
    y = torch.tensor(y)[order]
    return x[:1400], y[:1400], x[1400:], y[1400:]


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer,
                data: tuple[torch.Tensor, ...], epoch: int) -> float:
    """One epoch of minibatch training, then the validation accuracy."""
    x, y, xv, yv = data
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
    model.train()
    for idx in order.split(BATCH):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        return (model(xv).argmax(1) == yv).float().mean().item()


class Timings:
    """Per-epoch wall times, checkpoint writes and the checkpoint JSON sizes of one run."""

    def __init__(self, latest: Path, controller: perfora.GrowthController) -> None:
        self.latest = latest
        self.controller = controller
        self.cost: list[float] = []
        self.epoch: list[float] = []
        self.wrote: list[bool] = []
        self.json_size: dict[int, int] = {}
        self._seen: tuple[int, int] | None = None

    def record(self, epoch: int, train_s: float, cost_s: float, sizes_at: set[int]) -> None:
        """One epoch; whether ``latest`` changed (outside the timed part)."""
        self.cost.append(cost_s)
        self.epoch.append(train_s)
        stat = self.latest.stat() if self.latest.exists() else None
        seen = None if stat is None else (stat.st_ino, stat.st_mtime_ns)
        self.wrote.append(seen is not None and seen != self._seen)
        self._seen = seen
        if epoch in sizes_at:  # what a checkpoint written now holds as JSON
            self.json_size[epoch] = len(json.dumps(self.controller.to_checkpoint().meta))

    def summary(self) -> dict:
        ms = [c * 1e3 for c in self.cost]
        quiet = [c for c, w in zip(ms, self.wrote, strict=True) if not w]
        train = statistics.median(self.epoch) * 1e3
        return {"epochs": len(ms), "median_ms": statistics.median(ms),
                "p90_ms": statistics.quantiles(ms, n=10)[-1],
                "median_no_write_ms": statistics.median(quiet) if quiet else None,
                "train_epoch_ms": train,
                "fraction": statistics.median(ms) / (train + statistics.median(ms)),
                "checkpoint_writes": sum(self.wrote),
                "json_bytes": {str(k): v for k, v in sorted(self.json_size.items())}}


def run_native(data: tuple[torch.Tensor, ...], epochs: int, folder: Path) -> dict:
    """``controller.step(score)`` per epoch."""
    model = perfora.perforate(build())
    ctl = perfora.GrowthController(model, run_dir=folder, maximize=True,
                                   n_epochs_to_switch=PATIENCE)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    optimizer, _ = ctl.build_optimizer()
    timings = Timings(ctl.checkpoint_path("latest"), ctl)

    def perfora_calls(score: float) -> None:
        ctl.step(score)

    return _loop(lambda e: train_epoch(model, optimizer, data, e), perfora_calls, timings,
                 epochs)


def run_compat(data: tuple[torch.Tensor, ...], epochs: int, folder: Path) -> dict:
    """PerforatedAI's three tracker calls per epoch."""
    GPA.reset()
    GPA.pc.set_testing_dendrite_capacity(False)
    GPA.pc.set_n_epochs_to_switch(PATIENCE)
    GPA.pc.set_silent(True)
    model = UPA.perforate_model(build(), save_name=str(folder), maximizing_score=True)
    GPA.pai_tracker.set_optimizer(torch.optim.Adam)
    optimizer, _ = GPA.pai_tracker.setup_optimizer(model, {"lr": 1e-3})
    timings = Timings(folder / "latest.pt", GPA.pai_tracker.controller)
    state = {"model": model}

    def perfora_calls(score: float) -> None:
        GPA.pai_tracker.add_extra_score(score * 100, "train_acc")
        GPA.pai_tracker.add_test_score(score, "test_acc")
        state["model"], _, _ = GPA.pai_tracker.add_validation_score(score, state["model"])

    try:
        return _loop(lambda e: train_epoch(state["model"], optimizer, data, e), perfora_calls,
                     timings, epochs)
    finally:
        GPA.reset()


def _loop(train: Callable[[int], float], calls: Callable[[float], None], timings: Timings,
          epochs: int) -> dict:
    """Train, then time the perfora calls, ``epochs`` times."""
    sizes_at = {min(10, epochs), epochs}
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        score = train(epoch)
        mid = time.perf_counter()
        calls(score)
        end = time.perf_counter()
        timings.record(epoch, mid - start, end - mid, sizes_at)
    return timings.summary()


def table(results: dict[str, dict]) -> str:
    """The results as a plain-text table."""
    head = (f"{'API':8} {'median ms':>10} {'p90 ms':>8} {'no-write ms':>12} {'epoch ms':>9} "
            f"{'fraction':>9} {'writes':>7} {'JSON bytes (10 -> N)':>22}")
    lines = [head]
    for name, r in results.items():
        sizes = " -> ".join(str(v) for v in r["json_bytes"].values())
        lines.append(f"{name:8} {r['median_ms']:10.3f} {r['p90_ms']:8.3f} "
                     f"{r['median_no_write_ms']:12.3f} {r['train_epoch_ms']:9.2f} "
                     f"{r['fraction']:9.2%} {r['checkpoint_writes']:>3}/{r['epochs']:<3} "
                     f"{sizes:>22}")
    return "\n".join(lines)


OUTPUT = "epoch_cost.json"


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    output_paths.add_output_options(parser, OUTPUT, "--json")
    return parser


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --json, else results/local/ (results/ with --update-stored)."""
    return output_paths.output_file(args, OUTPUT, "json")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    data = digits()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["native"] = run_native(data, args.epochs, Path(tmp) / "native")
        results["compat"] = run_compat(data, args.epochs, Path(tmp) / "compat")
    print(table(results))
    out = {"setup": {"model": "64-32-10 MLP", "data": "sklearn load_digits",
                     "batch": BATCH, "epochs": args.epochs, "threads": args.threads,
                     "fsync": os.environ.get("PERFORA_FSYNC", "1"),
                     "torch": torch.__version__, "perfora": perfora.__version__,
                     "python": platform.python_version()},
           "target_median_ms": 1.0,
           "quoted": {"perforatedai_fraction": 0.21, "perforatedai_epoch_ms": 10.0,
                      "source": "issue 16, PerforatedAI's three tracker calls on a digits "
                                "epoch; not measured here"},
           "results": results}
    path = output_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
