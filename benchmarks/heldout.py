"""Held-out check: data sets the quality benchmark does not tune on, used as a new user would.

A new user perforates a narrow MLP and creates a ``GrowthController`` with only ``maximize``
and the patience set, and reports the validation accuracy once per epoch. The grown model
(test accuracy at its best validation epoch) is compared with a plain MLP whose hidden width
gives the parameter count closest to the grown model's, trained the same way (same loop and
optimizer; ``max_dendrites=0``) twice: early-stopped with the same patience, and for exactly
as many epochs as the grown run took (no early stopping; the same budget). Data sets:
scikit-learn's iris and generated moons, circles, Gaussian quantiles and a 4-class
``make_classification``; seeds 0..N-1.

    python benchmarks/heldout.py [--seeds 5] [--json PATH] [--update-stored]
    python benchmarks/heldout.py --set grow_fraction=0.5     # a variant of the default

Writes benchmarks/results/local/heldout.json (git-ignored); ``--update-stored`` writes the
stored benchmarks/results/heldout.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import output_paths
import settings_arg
import torch
from torch import nn

from perfora import GrowthController, perforate

HIDDEN = 8
PATIENCE = 10
MAX_EPOCHS = 500


def _datasets() -> dict[str, Callable[[int], tuple[np.ndarray, np.ndarray]]]:
    from sklearn import datasets as ds

    return {
        "iris": lambda seed: ds.load_iris(return_X_y=True),
        "moons": lambda seed: ds.make_moons(1000, noise=0.25, random_state=seed),
        "circles": lambda seed: ds.make_circles(1000, noise=0.1, factor=0.5, random_state=seed),
        "quantiles": lambda seed: ds.make_gaussian_quantiles(n_samples=1000, n_features=4,
                                                             n_classes=3, random_state=seed),
        "classification": lambda seed: ds.make_classification(
            2000, n_features=20, n_informative=6, n_classes=4, random_state=seed),
    }


def split(x: np.ndarray, y: np.ndarray, seed: int) -> dict[str, tuple[torch.Tensor, ...]]:
    """Stratified 60/20/20, standardized with the training statistics."""
    from sklearn.model_selection import train_test_split

    x_tr, x_rest, y_tr, y_rest = train_test_split(x, y, test_size=0.4, stratify=y,
                                                  random_state=seed)
    x_va, x_te, y_va, y_te = train_test_split(x_rest, y_rest, test_size=0.5,
                                              stratify=y_rest, random_state=seed)
    mean, std = x_tr.mean(0), x_tr.std(0) + 1e-8
    return {k: (torch.tensor((a - mean) / std, dtype=torch.float32), torch.tensor(b))
            for k, (a, b) in {"train": (x_tr, y_tr), "val": (x_va, y_va),
                              "test": (x_te, y_te)}.items()}


def mlp(inputs: int, hidden: int, classes: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def train(data: dict, hidden: int, seed: int, budget: int | None = None, **settings) -> dict:
    """The new user's loop; returns test accuracy at the best epoch, params, dendrite sets and
    neuron steps. With ``budget``: a plain network trained exactly that many epochs."""
    if budget is not None:
        settings.update(max_dendrites=0, n_epochs_to_switch=budget + 1)
    torch.manual_seed(seed)
    x, y = data["train"]
    classes = int(y.max()) + 1
    model = perforate(mlp(x.shape[1], hidden, classes))
    ctl = GrowthController(model, **{"maximize": True, "n_epochs_to_switch": PATIENCE,
                                     "write_files": False, **settings})
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(budget if budget is not None else MAX_EPOCHS):
        for idx in torch.randperm(len(x), generator=gen).split(32):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        decision = ctl.step(accuracy(model, *data["val"]),
                            test_score=accuracy(model, *data["test"]))
        if decision.complete:
            break
        opt = decision.optimizer
    return {"test": ctl.state.best_test, "params": ctl.parameter_count(),
            "dendrites": ctl.num_dendrites, "neurons": ctl.state.num_widenings,
            "epochs": ctl.epoch}


def paired_gap(rows: list[dict]) -> float:
    """Median over seeds of (grown - the plain network of its size trained as many epochs on
    the same seed), in points: the comparison without the spread between the seeds' splits."""
    return statistics.median(100 * (r["grown"]["test"] - r["matched"]["test"]) for r in rows)


def width_for(params: int, inputs: int, classes: int) -> int:
    """Hidden width of the plain MLP with the parameter count closest to ``params``."""
    return max(1, round((params - classes) / (inputs + 1 + classes)))


OUTPUT = "heldout.json"


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5,
                        help="seeds 0..N-1 (default 5: with 3, one seed moves a median)")
    output_paths.add_output_options(parser, OUTPUT, "--json")
    settings_arg.add_set_argument(
        parser, help="PerforaConfig overrides for the grown run (JSON values), to measure a "
                     "variant of the default; the plain networks are unchanged")
    return parser


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --json, else results/local/ (results/ with --update-stored)."""
    return output_paths.output_file(args, OUTPUT, "json")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    variant = settings_arg.parse_settings(parser, args.set)
    torch.set_num_threads(1)
    start = time.perf_counter()
    rows = []
    for name, load in _datasets().items():
        for seed in range(args.seeds):
            data = split(*load(seed), seed)
            x, y = data["train"]
            grown = train(data, HIDDEN, seed, **variant)
            width = width_for(grown["params"], x.shape[1], int(y.max()) + 1)
            plain = train(data, width, seed, max_dendrites=0)
            matched = train(data, width, seed, budget=grown["epochs"])
            rows.append({"dataset": name, "seed": seed, "grown": grown, "plain": plain,
                         "matched": matched, "plain_width": width})
            print(f"{name} seed {seed}: grown {grown['test']:.3f} ({grown['params']} params, "
                  f"{grown['dendrites']} sets, {grown['neurons']} neuron steps, "
                  f"{grown['epochs']} epochs) vs plain width {width} {plain['test']:.3f} "
                  f"early-stopped, {matched['test']:.3f} in {matched['epochs']} epochs "
                  f"({plain['params']} params)", file=sys.stderr, flush=True)
    lines = ["| data set | grown | params | sets | neuron steps | plain, early-stopped | "
             "plain, grown's epochs | grown minus plain: early-stopped | same epochs | "
             "same epochs, paired |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    summary = []
    for name in _datasets():
        mine = [r for r in rows if r["dataset"] == name]

        def med(arm: str, key: str, mine: list = mine) -> float:
            return statistics.median(r[arm][key] for r in mine)

        gap = 100 * (med("grown", "test") - med("plain", "test"))
        gap_matched = 100 * (med("grown", "test") - med("matched", "test"))
        paired = paired_gap(mine)
        summary.append({"dataset": name, "grown": med("grown", "test"),
                        "plain": med("plain", "test"), "gap": gap,
                        "matched": med("matched", "test"), "gap_matched": gap_matched,
                        "gap_matched_paired": paired})
        lines.append(f"| {name} | {100 * med('grown', 'test'):.1f} | "
                     f"{med('grown', 'params'):.0f} | {med('grown', 'dendrites'):g} | "
                     f"{med('grown', 'neurons'):g} | {100 * med('plain', 'test'):.1f} | "
                     f"{100 * med('matched', 'test'):.1f} | {gap:+.1f} | {gap_matched:+.1f} | "
                     f"{paired:+.1f} |")
    total = time.perf_counter() - start
    at_least = sum(s["gap_matched"] >= 0 for s in summary)
    print("\n".join(lines))
    print(f"\ngrown at least as good as plain of the same size trained as many epochs on "
          f"{at_least} of {len(summary)} data sets; {args.seeds} seed(s); {total:.0f} s")
    path = output_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hidden": HIDDEN, "patience": PATIENCE, "settings": variant,
                                     "seeds": args.seeds, "summary": summary, "runs": rows,
                                     "total_seconds": total, "torch": torch.__version__},
                                    indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
