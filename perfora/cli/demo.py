"""`perfora demo`: a narrow MLP on scikit-learn's digits, four arms: the narrow baseline, the
narrow network grown with perfora's defaults (dendrites and neurons, as the validation score
chooses), and a plain network widened to the grown size (the question a user asks: "grow it,
or just train a wider layer?"), twice: early-stopped with the same patience, and trained as
many epochs as the grown run (the same budget), each ending on its best validation epoch."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import PerforaConfig
from ..errors import ConfigError
from ..growth import GrowthController
from ..growth.history_marks import describe_growth, history_marks
from ..nn.perforation import perforate

SPLIT_SEED = 1234  # the train/validation/test split is fixed, whatever --seed says
SAME_BUDGET = "wider-eq"
"""The plain network of the grown size, trained as many epochs as the grown run."""


@dataclass
class DemoData:
    """Digits as tensors, split 60/20/20 once and for all."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


@dataclass
class ArmResult:
    """One arm of the demo (a row of its table)."""

    name: str
    params: int
    dendrites: int
    neuron_steps: int
    hidden_width: int
    test_accuracy: float
    val_accuracy: float
    epochs: int
    seconds: float
    restructures: int
    run_dir: str
    growth: str = ""
    """What the run grew and kept, in order, and how many steps it undid."""


def load_digits_data() -> DemoData:
    """scikit-learn's 8x8 digits (1,797 images), scaled to [0, 1], fixed split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("perfora demo needs scikit-learn: pip install 'perfora[demo]'") from exc
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    x, y = x[order], y[order]
    n_train, n_val = int(0.6 * len(x)), int(0.2 * len(x))
    cut = n_train + n_val
    return DemoData(x[:n_train], y[:n_train], x[n_train:cut], y[n_train:cut], x[cut:], y[cut:])


def narrow_mlp(hidden: int = 6) -> nn.Module:
    """A deliberately narrow MLP: 64 -> hidden -> 10."""
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def width_for_params(params: int) -> int:
    """The hidden width whose plain MLP (64 -> width -> 10) has the closest parameter count."""
    per_unit, fixed = 64 + 1 + 10, 10
    return max(1, round((params - fixed) / per_unit))


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    acc = (model(x).argmax(dim=1) == y).float().mean().item()
    model.train()
    return acc


def run_arm(name: str, data: DemoData, config: PerforaConfig, *, seed: int, hidden: int,
            run_dir: Path | None, max_epochs: int = 2000, batch_size: int = 64,
            lr: float = 1e-2, progress: bool = True, fixed_epochs: int | None = None
            ) -> ArmResult:
    """Train one arm until its controller says training is complete, or, with
    ``fixed_epochs``, for exactly that many epochs, then go back to the best one."""
    from tqdm.auto import tqdm

    if fixed_epochs is not None:  # no early stopping: the whole budget, then the best epoch
        max_epochs = fixed_epochs
        config = config.replace(n_epochs_to_switch=fixed_epochs + 1)
    torch.manual_seed(seed)
    model = perforate(narrow_mlp(hidden))
    ctl = GrowthController(model, config, run_dir=run_dir)
    ctl.set_optimizer(torch.optim.Adam, lr=lr)
    optimizer, _ = ctl.build_optimizer()
    loss_fn = nn.CrossEntropyLoss()
    shuffle = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    bar = tqdm(total=max_epochs, desc=f"{name:>9}", disable=not progress, leave=True,
               unit="ep", dynamic_ncols=True)
    restructures = 0
    try:
        for _ in range(max_epochs):
            for idx in torch.randperm(len(data.x_train), generator=shuffle).split(batch_size):
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(data.x_train[idx]), data.y_train[idx]).backward()
                optimizer.step()
            val = accuracy(model, data.x_val, data.y_val)
            test = accuracy(model, data.x_test, data.y_test)
            decision = ctl.step(val, test_score=test)
            restructures += decision.action == "restructure"
            optimizer = decision.optimizer
            bar.update(1)
            bar.set_postfix(val=f"{val:.3f}", dendrites=decision.num_dendrites,
                            width=decision.model[0].num_neurons)
            if decision.complete:
                break
    finally:
        bar.close()
    if fixed_epochs is not None:
        model = ctl.restore_best()
    ctl.finish()
    seconds = time.perf_counter() - start
    return ArmResult(
        name=name, params=ctl.parameter_count(), dendrites=ctl.num_dendrites,
        neuron_steps=ctl.state.num_widenings, hidden_width=model[0].num_neurons,
        test_accuracy=accuracy(model, data.x_test, data.y_test),
        val_accuracy=accuracy(model, data.x_val, data.y_val), epochs=ctl.epoch,
        seconds=round(seconds, 3), restructures=restructures,
        run_dir=str(run_dir) if run_dir else "",
        growth=describe_growth(history_marks(ctl.state.history, ctl.state.switch_epochs,
                                             ctl.state.growth_kinds)))


OWN_OPTIONS = {"growth": "--growth", "max_dendrites": "--max-dendrites",
               "n_epochs_to_switch": "--patience", "patience": "--patience", "seed": "--seed"}
"""Settings the demo has an option for: ``--set`` refuses them and names the option."""


def grown_config(settings: Mapping[str, Any] = (), **demo: Any) -> PerforaConfig:
    """The grown arm's settings: the demo's own (``demo``), then ``settings`` (``--set``);
    a ConfigError, before anything trains, for a setting the demo fixes or one that fails."""
    for name in settings:
        if name in OWN_OPTIONS:
            raise ConfigError(f"--set {name}: the demo has an option for it, "
                              f"{OWN_OPTIONS[name]}")
        if name in ("maximize", "score"):
            raise ConfigError(f"--set {name}: the demo reports the validation accuracy "
                              "(higher is better); it is not a setting here")
    return PerforaConfig(**demo).replace(**settings)


def run_demo(*, seed: int = 0, out: str | Path | None = "perfora_runs/demo", hidden: int = 6,
             patience: int = 10, max_dendrites: int = 3, growth: str = "auto",
             settings: Mapping[str, Any] | None = None, progress: bool = True
             ) -> dict[str, Any]:
    """The four arms; returns {"arms": [...], ...} as `--json` prints. ``max_dendrites``
    caps the grown arm's dendrite sets (its neuron steps keep perfora's default cap);
    ``growth`` is what it grows (PerforaConfig's setting: 'auto', 'dendrites', 'neurons');
    ``settings``: more PerforaConfig settings for the grown arm (``--set``)."""
    settings = dict(settings or {})
    common = {"n_epochs_to_switch": patience, "seed": seed}
    grown = grown_config(settings, max_dendrites=max_dendrites, growth=growth, **common)
    data = load_digits_data()
    out_dir = Path(out) if out else None
    plain = PerforaConfig(switch_mode="never", max_dendrites=0, **common)

    def arm(name: str, config: PerforaConfig, width: int, epochs: int | None = None
            ) -> ArmResult:
        return run_arm(name, data, config, seed=seed, hidden=width,
                       run_dir=out_dir / name if out_dir else None, progress=progress,
                       fixed_epochs=epochs)

    results = [arm("baseline", plain, hidden), arm("grown", grown, hidden)]
    wider = width_for_params(results[1].params)
    results.append(arm("wider", plain, wider))
    results.append(arm(SAME_BUDGET, plain, wider, epochs=results[1].epochs))
    return {"seed": seed, "hidden": hidden, "patience": patience, "growth": growth,
            "settings": settings, "wider_hidden": wider,
            "dataset": "sklearn digits (1797 images, fixed 60/20/20 split)",
            "arms": [asdict(r) for r in results]}


def run_files_line(result: dict[str, Any], out: str | Path) -> str:
    """Where each arm's run files are (one folder per arm, named after it)."""
    folders = [f"{Path(out) / a['name']}" for a in result["arms"]] or [str(out)]
    listed = folders[0] if len(folders) == 1 else f"{', '.join(folders[:-1])} and {folders[-1]}"
    return (f"run files (metrics.csv, best_arch_scores.csv, history.png, checkpoints) in "
            f"{listed}")


def format_table(result: dict[str, Any]) -> str:
    """The demo's results as a plain-text table, and the verdict against the wider arms."""
    head = f"{'arm':<10} {'params':>7} {'hidden':>6} {'dendrites':>9} {'test acc':>9} " \
           f"{'val acc':>8} {'epochs':>6} {'seconds':>8}"
    lines = [head, "-" * len(head)]
    for a in result["arms"]:
        lines.append(f"{a['name']:<10} {a['params']:>7} {a['hidden_width']:>6} "
                     f"{a['dendrites']:>9} {a['test_accuracy']:>9.4f} {a['val_accuracy']:>8.4f} "
                     f"{a['epochs']:>6} {a['seconds']:>8.2f}")
    arms = {a["name"]: a for a in result["arms"]}
    if "wider" in arms:
        grown, wide = arms["grown"], arms["wider"]

        def gap(other: dict[str, Any]) -> str:
            return f"{100 * (grown['test_accuracy'] - other['test_accuracy']):+.1f}"

        same = f", {gap(arms[SAME_BUDGET])} trained as many epochs as grown ({SAME_BUDGET})" \
            if SAME_BUDGET in arms else ""
        lines.append("")
        lines.append(f"grown vs a plain network of the same size (hidden "
                     f"{result['wider_hidden']}, {wide['params']} params), points of test "
                     "accuracy:")
        lines.append(f"  {gap(wide)} early-stopped (wider){same}")
        lines.append("  (one seed; benchmarks/quality.py gives medians over seeds and tasks)")
        if grown.get("growth"):
            lines.append(f"how grown grew: {grown['growth']}")
        if result.get("settings"):
            lines.append("grown with: " + ", ".join(f"{k}={v!r}"
                                                     for k, v in result["settings"].items()))
    return "\n".join(lines)
