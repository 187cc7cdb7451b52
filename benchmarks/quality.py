"""Learning-quality benchmark: does growing dendrites beat the same network without them?

Datasets that ship offline (scikit-learn digits, wine, breast cancer) and two spirals
generated in code; narrow MLPs; several seeds. Arms, all with the same patience:

- ``baseline``: no dendrites, early stopping (``max_dendrites=0``).
- ``gd``: dendrites co-trained by gradient descent.
- ``correlation``: dendrites trained on the correlation rule (dendrite and neuron phases).
- ``matched``: the baseline network trained for as many epochs as the correlation arm used,
  its optimizer restarted at the epochs where that arm restructured or changed phase, keeping
  its best-validation checkpoint (so a gain is neither longer training nor restarts).
- ``half+corr``: a half-width network with correlation dendrites, against ``baseline``
  (compression).

The controller sees the validation loss; the score reported is the test accuracy at the best
validation epoch. ``--quick`` runs fewer seeds and shorter caps (a few minutes on 2 cores).

    python benchmarks/quality.py --quick [--json benchmarks/results/quality_quick.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from perfora import GrowthController, PerforaConfig, perforate


@dataclass
class Data:
    name: str
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]]
    classes: int
    width: int
    depth: int
    scale: int = 1
    """Patience and epoch cap multiplier (two spirals needs long training)."""


def _split_sklearn(name: str, loader: Callable, width: int, seed: int) -> Data:
    """Stratified 60/20/20 split, standardized with the training statistics."""
    from sklearn.model_selection import train_test_split

    x, y = loader(return_X_y=True)
    x_tr, x_rest, y_tr, y_rest = train_test_split(x, y, test_size=0.4, stratify=y,
                                                  random_state=seed)
    x_va, x_te, y_va, y_te = train_test_split(x_rest, y_rest, test_size=0.5, stratify=y_rest,
                                              random_state=seed)
    mean, std = x_tr.mean(0), x_tr.std(0) + 1e-8
    splits = {k: (torch.tensor((a - mean) / std, dtype=torch.float32), torch.tensor(b))
              for k, (a, b) in {"train": (x_tr, y_tr), "val": (x_va, y_va),
                                "test": (x_te, y_te)}.items()}
    return Data(name, splits, int(y.max()) + 1, width, 1)


def two_spirals(offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Lang & Witbrock's two spirals (97 points per class); ``offset`` shifts the angles."""
    i = np.arange(97) + offset
    angle = i * math.pi / 16
    radius = 6.5 * (104 - i) / 104
    a = np.stack([radius * np.sin(angle), radius * np.cos(angle)], 1)
    x = np.concatenate([a, -a]) * (3 / 6.5)  # radius <= 3: tanh units resolve the turns
    y = np.concatenate([np.zeros(97), np.ones(97)]).astype(np.int64)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def spirals(width: int) -> Data:
    """Train on the classic 194 points; validate and test on points halfway between."""
    x_mid, y_mid = two_spirals(0.5)
    return Data("spirals", {"train": two_spirals(0.0), "val": (x_mid[::2], y_mid[::2]),
                            "test": (x_mid[1::2], y_mid[1::2])}, 2, width, 2, scale=5)


def datasets(seed: int) -> list[Data]:
    from sklearn.datasets import load_breast_cancer, load_digits, load_wine

    return [_split_sklearn("digits", load_digits, 8, seed),
            _split_sklearn("wine", load_wine, 4, seed),
            _split_sklearn("breast_cancer", load_breast_cancer, 4, seed),
            spirals(8)]


def mlp(inputs: int, width: int, depth: int, classes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(inputs, width), nn.Tanh()]
        inputs = width
    return nn.Sequential(*layers, nn.Linear(inputs, classes))


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
    patience: int
    max_dendrites: int
    max_epochs: int
    lr: float = 0.01
    batch: int = 32


def run_controller(data: Data, width: int, seed: int, setup: Setup, **settings) -> dict:
    """One controller-driven run; returns score, params, epochs, seconds, restart epochs."""
    torch.manual_seed(seed)
    x, y = data.splits["train"]
    model = perforate(mlp(x.shape[1], width, data.depth, data.classes))
    config = PerforaConfig(maximize=False, n_epochs_to_switch=setup.patience * data.scale,
                           improvement_threshold=1e-3, seed=seed, save_checkpoints=False,
                           **settings)
    ctl = GrowthController(model, config, write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=setup.lr)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(seed)
    restarts: list[int] = []
    start = time.perf_counter()
    for epoch in range(1, setup.max_epochs * data.scale + 1):
        train_epoch(model, opt, x, y, gen, setup.batch)
        val_loss, _ = evaluate(model, *data.splits["val"])
        _, test_acc = evaluate(model, *data.splits["test"])
        decision = ctl.step(val_loss, test_score=test_acc)
        if decision.complete:
            break
        if decision.restructured:
            opt = decision.optimizer
            restarts.append(epoch)
    seconds = time.perf_counter() - start
    dendrite_epochs = sum(1 for r in ctl.state.history if r["phase"] == "dendrite")
    return {"test": ctl.state.best_test, "params": ctl.parameter_count(),
            "epochs": ctl.epoch, "seconds": seconds, "restarts": restarts,
            "dendrites": ctl.num_dendrites, "dendrite_epochs": dendrite_epochs}


def run_matched(data: Data, seed: int, setup: Setup, epochs: int, restarts: list[int]) -> dict:
    """The baseline network for ``epochs`` epochs, optimizer restarted at ``restarts``."""
    torch.manual_seed(seed)
    x, y = data.splits["train"]
    model = mlp(x.shape[1], data.width, data.depth, data.classes)
    opt = torch.optim.Adam(model.parameters(), lr=setup.lr)
    gen = torch.Generator().manual_seed(seed)
    best_val, best_test = math.inf, None
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        train_epoch(model, opt, x, y, gen, setup.batch)
        val_loss, _ = evaluate(model, *data.splits["val"])
        if val_loss < best_val * (1 - 1e-3):
            best_val, best_test = val_loss, evaluate(model, *data.splits["test"])[1]
        if epoch in restarts:
            opt = torch.optim.Adam(model.parameters(), lr=setup.lr)
    return {"test": best_test, "params": sum(p.numel() for p in model.parameters()),
            "epochs": epochs, "seconds": time.perf_counter() - start}


ARMS = ("baseline", "gd", "correlation", "matched", "half+corr")


def run_all(seeds: list[int], setup: Setup, only: list[str] | None) -> dict:
    """Every arm on every dataset and seed: {dataset: {arm: [run, ...]}}."""
    results: dict[str, dict[str, list[dict]]] = {}
    for seed in seeds:
        for data in datasets(seed):
            if only and data.name not in only:
                continue
            arms = results.setdefault(data.name, {a: [] for a in ARMS})
            common = {"max_dendrites": setup.max_dendrites}
            arms["baseline"].append(run_controller(data, data.width, seed, setup,
                                                   max_dendrites=0))
            arms["gd"].append(run_controller(data, data.width, seed, setup, rule="gd",
                                             **common))
            corr = run_controller(data, data.width, seed, setup, rule="correlation", **common)
            arms["correlation"].append(corr)
            arms["matched"].append(run_matched(data, seed, setup, corr["epochs"],
                                               corr["restarts"]))
            arms["half+corr"].append(run_controller(data, max(1, data.width // 2), seed,
                                                    setup, rule="correlation", **common))
            print(f"seed {seed} {data.name}: " + ", ".join(
                f"{a} {arms[a][-1]['test']:.3f}" for a in ARMS), file=sys.stderr, flush=True)
    return results


def summarize(results: dict) -> list[dict]:
    """Median test accuracy, params, epochs and seconds per dataset and arm."""
    rows = []
    for name, arms in results.items():
        for arm, runs in arms.items():
            if not runs:
                continue
            rows.append({"dataset": name, "arm": arm, "runs": len(runs),
                         "test_acc": statistics.median(r["test"] for r in runs),
                         "params": statistics.median(r["params"] for r in runs),
                         "epochs": statistics.median(r["epochs"] for r in runs),
                         "seconds": statistics.median(r["seconds"] for r in runs),
                         "dendrites": statistics.median(r.get("dendrites", 0) for r in runs)})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| dataset | arm | median test acc | params | epochs | dendrites | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['arm']} | {r['test_acc']:.3f} | "
                     f"{r['params']:.0f} | {r['epochs']:.0f} | {r['dendrites']:.0f} | "
                     f"{r['seconds']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a markdown table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds, short caps")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5)")
    parser.add_argument("--datasets", nargs="*", default=None, help="subset of datasets")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="where to write results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        setup = Setup(patience=8, max_dendrites=2, max_epochs=150)
        seeds = list(range(args.seeds or 3))
    else:
        setup = Setup(patience=10, max_dendrites=4, max_epochs=2000)
        seeds = list(range(args.seeds or 5))
    start = time.perf_counter()
    results = run_all(seeds, setup, args.datasets)
    rows = summarize(results)
    total = time.perf_counter() - start
    print(table(rows))
    print(f"\n{len(seeds)} seed(s), patience {setup.patience}, max_dendrites "
          f"{setup.max_dendrites}, epoch cap {setup.max_epochs} (spirals: patience and cap "
          f"x5); total {total:.0f} s")
    out = args.json or Path(__file__).parent / "results" / (
        "quality_quick.json" if args.quick else "quality.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"setup": setup.__dict__, "seeds": seeds, "summary": rows,
                               "runs": results, "total_seconds": total,
                               "torch": torch.__version__}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
