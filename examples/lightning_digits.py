"""Grow dendrites in a Lightning fit: sklearn digits, DDP on 2 CPU processes.

    python examples/lightning_digits.py                   # ddp, devices=2, on CPU
    python examples/lightning_digits.py --strategy ddp_spawn
    python examples/lightning_digits.py --devices 1 --strategy auto

The only perfora lines are the import, the callback in ``Trainer(callbacks=[...])`` and,
for ``ddp_spawn``, ``growth.prepare(model)`` before ``fit``. Under ``ddp_spawn`` the spawned
processes train; this process gets the grown model back, and reads the scores from the run
files that rank 0 wrote (``OUT/perfora_runs/best_arch_scores.csv``).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from perfora import dendritic_layers
from perfora.integrations.lightning import DendriteGrowth


class DigitsClassifier(pl.LightningModule):
    """A plain MLP classifier; nothing in it knows about dendrites."""

    def __init__(self, hidden: int = 16, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self(x).argmax(-1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True, prog_bar=True)

    def configure_optimizers(self):
        # perfora calls this again after every growth step, over the new parameters
        return torch.optim.Adam((p for p in self.parameters() if p.requires_grad),
                                lr=self.hparams.lr)


def digits_loaders(batch_size: int = 64) -> tuple[DataLoader, DataLoader]:
    """sklearn's 8x8 digits, a fixed 80/20 split."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, val = perm[:1440], perm[1440:]
    return (DataLoader(TensorDataset(x[train], y[train]), batch_size=batch_size, shuffle=True),
            DataLoader(TensorDataset(x[val], y[val]), batch_size=256))


def spawned_result(model: nn.Module, run_dir: Path) -> tuple[int, int, float]:
    """(epochs, dendrite sets, best val_acc) of a fit that ran in spawned processes: the
    sets the model came back with, and the epochs and best score from the run files that
    rank 0 wrote."""
    sets = max((layer.num_dendrites for layer in dendritic_layers(model).values()), default=0)
    with open(run_dir / "metrics.csv", newline="") as f:
        epochs = max(int(row["epoch"]) for row in csv.DictReader(f))
    with open(run_dir / "best_arch_scores.csv", newline="") as f:
        best = max(float(row["best_val_score"]) for row in csv.DictReader(f))
    return epochs, sets, best


def accuracy(model: nn.Module, loader: DataLoader) -> float:
    """The model's accuracy over a whole loader, in this process."""
    model.eval()
    with torch.no_grad():
        hits = sum(int((model(x).argmax(-1) == y).sum()) for x, y in loader)
    return hits / len(loader.dataset)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--max-epochs", type=int, default=150)
    ap.add_argument("--patience", type=int, default=8)
    ap.add_argument("--max-dendrites", type=int, default=3)
    ap.add_argument("--out", default="perfora_runs/lightning_digits",
                    help="Lightning's root folder (default perfora_runs/lightning_digits, "
                         "git-ignored)")
    args = ap.parse_args()
    pl.seed_everything(0, workers=True)

    model = DigitsClassifier()
    growth = DendriteGrowth(monitor="val_acc", mode="max", patience=args.patience,
                            max_dendrites=args.max_dendrites, module="net")
    if args.strategy.startswith("ddp_spawn"):
        growth.prepare(model)  # the launching process must hold the perforated model
    trainer = pl.Trainer(
        accelerator="cpu", devices=args.devices, strategy=args.strategy,
        max_epochs=args.max_epochs, default_root_dir=args.out, log_every_n_steps=10,
        callbacks=[growth, ModelCheckpoint(monitor="val_acc", mode="max", save_last=True)],
        enable_progress_bar=False)
    train, val = digits_loaders()
    trainer.fit(model, train, val)

    if trainer.is_global_zero:
        run_dir = Path(args.out) / "perfora_runs"
        ctl = growth.controller
        if ctl is not None:  # this process trained (ddp: rank 0; one device)
            epochs, dendrites, best, where = ctl.epoch, ctl.num_dendrites, ctl.best_score, ""
        else:  # ddp_spawn: the spawned processes trained and are gone
            epochs, dendrites, best = spawned_result(model, run_dir)
            where = " (trained in the spawned processes; read back from their run files)"
        print(f"stopped after {epochs} epochs: dendrites={dendrites}, "
              f"best val_acc={best:.4f}, "
              f"parameters={sum(p.numel() for p in model.parameters())}, "
              f"run files in {run_dir}{where}")
        # the model fit returned is the best one: its own accuracy on the validation set
        print(f"the returned model: val_acc={accuracy(model, val):.4f}")


if __name__ == "__main__":
    main()
