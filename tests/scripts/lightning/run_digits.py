"""A Lightning fit on sklearn digits with DendriteGrowth; each rank writes what tests check.

Run as a script (Lightning's ddp launcher re-executes it for rank 1). Writes
``<out>/rank<R>.pt`` with the final parameters, the callback's decisions and trainer state.
(ddp_spawn runs ``examples/lightning_digits.py`` in the tests.)
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from perfora.integrations.lightning import DendriteGrowth


def digits_loaders(batch_size: int) -> tuple[DataLoader, DataLoader]:
    """Fixed split of the 8x8 digits: 1400 train, 397 validation samples."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    train = TensorDataset(x[:1400], y[:1400])
    val = TensorDataset(x[1400:], y[1400:])
    return (DataLoader(train, batch_size=batch_size, shuffle=False),
            DataLoader(val, batch_size=200))


def normed_cnn() -> nn.Sequential:
    """A CNN on the 8x8 images whose convs feed a GroupNorm (groups of 2) and an
    InstanceNorm: neuron steps widen through both."""
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 6, 3, padding=1),
                         nn.GroupNorm(3, 6), nn.ReLU(), nn.Conv2d(6, 8, 3, padding=1),
                         nn.InstanceNorm2d(8, affine=True), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 64, 10))


class DigitsNet(pl.LightningModule):
    """A small MLP; ``shard`` applies perfora.shard_fsdp2 under ModelParallelStrategy."""

    def __init__(self, hidden: int = 16, lr: float = 0.01, shard: bool | str = False,
                 net: str = "mlp") -> None:
        super().__init__()
        self.net = normed_cnn() if net == "normed-cnn" else \
            nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        self.lr, self.shard = lr, shard

    def configure_model(self) -> None:
        import perfora
        from perfora.parallel.sharded_state import is_fsdp1

        if self.shard == "fsdp1":
            if not is_fsdp1(self.net):
                self.net = perfora.wrap_fsdp1(self.net,
                                              device_id=self.trainer.strategy.root_device)
        elif self.shard:
            perfora.shard_fsdp2(self.net, mesh=self.device_mesh["data_parallel"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        acc = (logits.argmax(-1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True, prog_bar=True)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("test_acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)
        self.log("test_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=self.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": sched}


class GrowthWithoutRewrap(DendriteGrowth):
    """Negative control: rebuild the optimizers but keep the old DDP wrapper."""

    def _rebuild(self, trainer) -> None:
        trainer.strategy.setup_optimizers(trainer)


class RecordStart(pl.Callback):
    """The parameters as training starts (after a checkpoint was restored), for the record."""

    def __init__(self) -> None:
        self.params: dict[str, torch.Tensor] | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.params = flat_params(pl_module)


class RecordEpochs(pl.Callback):
    """The parameters after each validation (after any growth step), as the checkpoint saved
    at that epoch's end holds them."""

    def __init__(self) -> None:
        self.params: dict[int, dict[str, torch.Tensor]] = {}
        self.metrics: dict[int, dict[str, float]] = {}

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self.params[trainer.current_epoch] = flat_params(pl_module)
            self.metrics[trainer.current_epoch] = {
                k: float(trainer.callback_metrics[k]) for k in ("val_loss", "val_acc")}


def flat_params(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, full (FSDP2 DTensors gathered), by name."""
    out = {}
    for name, p in module.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = t.detach().float().cpu().clone()
    return out


def make_strategy(args: argparse.Namespace) -> tuple[bool | str, object]:
    """(the model's ``shard`` setting, a new Trainer strategy) for ``--strategy``."""
    strategy = args.strategy
    shard: bool | str = strategy == "model_parallel"
    if strategy == "fsdp1":
        from lightning.pytorch.strategies import FSDPStrategy

        shard, strategy = "fsdp1", FSDPStrategy(use_orig_params=True)
    if shard is True:
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(data_parallel_size=args.devices,
                                         tensor_parallel_size=1,
                                         save_distributed_checkpoint=args.dcp)
    return shard, strategy


def evaluate_checkpoints(args: argparse.Namespace, trainer: pl.Trainer, model: DigitsNet,
                         val: DataLoader, ckpts: Path, last_epoch: int) -> dict[str, dict]:
    """After the fit: the same Trainer tests the epoch-0 checkpoint (before any growth) and
    validates the last epoch's; a fresh Trainer tests a fresh module on the epoch-2 one. Each
    entry: the metrics, the parameters and the widths the model then has."""
    def state(module: nn.Module, metrics: list[dict]) -> dict:
        return {"metrics": {k: float(v) for k, v in metrics[0].items()},
                "params": flat_params(module),
                "sharded": any(type(p).__name__ == "DTensor" for p in module.parameters()),
                "widths": {n: m.num_neurons for n, m in
                           __import__("perfora").dendritic_layers(module).items()}}

    last = ckpts / f"epoch{last_epoch}.ckpt"
    first = trainer.test(model, val, ckpt_path=str(ckpts / "epoch0.ckpt"), verbose=False)
    out = {"test_epoch0": state(model, first)}
    out["validate_last"] = state(model, trainer.validate(model, val, ckpt_path=str(last),
                                                         verbose=False))
    shard, strategy = make_strategy(args)
    fresh = DigitsNet(shard=shard, net=args.net)
    fresh_trainer = pl.Trainer(accelerator=args.accelerator, devices=args.devices,
                               strategy=strategy, logger=False, enable_progress_bar=False,
                               enable_model_summary=False, default_root_dir=str(ckpts.parent),
                               callbacks=[DendriteGrowth(monitor="val_acc", mode="max",
                                                         module="net", growth=args.growth)])
    out["fresh_epoch2"] = state(fresh, fresh_trainer.test(fresh, val,
                                                          ckpt_path=str(ckpts / "epoch2.ckpt"),
                                                          verbose=False))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--max-epochs", type=int, default=12)
    ap.add_argument("--patience", type=int, default=2)
    ap.add_argument("--max-dendrites", type=int, default=2)
    ap.add_argument("--switch-mode", default="fixed")
    ap.add_argument("--fixed-switch-num", type=int, default=3)
    ap.add_argument("--precision", default="32-true")
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--ckpt-path", default=None)
    ap.add_argument("--save-last", action="store_true")
    ap.add_argument("--save-every-epoch", action="store_true",
                    help="a checkpoint ckpt/epoch<N>.ckpt at every epoch's end, and the "
                         "parameters it holds in the record")
    ap.add_argument("--rule", default="gd")
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--no-rewrap", action="store_true", help="negative control")
    ap.add_argument("--dcp", action="store_true", help="ModelParallel: distributed checkpoints")
    ap.add_argument("--retain", action="store_true")
    ap.add_argument("--grow-fraction", type=float, default=None)
    ap.add_argument("--dendrite-init", default=None)
    ap.add_argument("--growth", default="dendrites", help="dendrites, neurons or auto")
    ap.add_argument("--net", default="mlp", help="mlp, or normed-cnn (GroupNorm, InstanceNorm)")
    ap.add_argument("--evaluate-checkpoints", action="store_true",
                    help="after fit (with --save-every-epoch): test, validate and test in a "
                         "fresh Trainer with checkpoints of other structures")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(7, workers=True)

    shard, strategy = make_strategy(args)
    model = DigitsNet(shard=shard, net=args.net)
    growth_cls = GrowthWithoutRewrap if args.no_rewrap else DendriteGrowth
    chosen = {k: v for k, v in (("grow_fraction", args.grow_fraction),
                                ("dendrite_init", args.dendrite_init),
                                ("growth", args.growth)) if v is not None}
    growth = growth_cls(**chosen,monitor="val_acc", mode="max", patience=args.patience,
                            max_dendrites=args.max_dendrites, module="net", rule=args.rule,
                            switch_mode=args.switch_mode, fixed_switch_num=args.fixed_switch_num,
                            retain_all_dendrites=args.retain,
                            run_dir=str(out / "perfora"))
    start, epochs = RecordStart(), RecordEpochs()
    callbacks: list = [growth, start]
    if args.save_every_epoch:
        from lightning.pytorch.callbacks import ModelCheckpoint

        callbacks += [epochs, ModelCheckpoint(dirpath=str(out / "ckpt"), filename="epoch{epoch}",
                                              auto_insert_metric_name=False, save_top_k=-1,
                                              every_n_epochs=1)]
    if args.save_last:
        from lightning.pytorch.callbacks import ModelCheckpoint

        callbacks.append(ModelCheckpoint(dirpath=str(out / "ckpt"), save_last=True,
                                         save_top_k=0))
    from lightning.pytorch.loggers import CSVLogger

    trainer = pl.Trainer(accelerator=args.accelerator, devices=args.devices, strategy=strategy,
                         max_epochs=args.max_epochs, callbacks=callbacks,
                         precision=args.precision, accumulate_grad_batches=args.accumulate,
                         logger=CSVLogger(str(out / "logs"), name="run"),
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(out), deterministic=True)
    train, val = digits_loaders(args.batch_size)
    trainer.fit(model, train, val, ckpt_path=args.ckpt_path)

    decisions = [row.get("event") for row in growth.controller.state.history] \
        if growth.controller is not None else []
    record = {
        "params": flat_params(model),
        "start_params": start.params,
        "epoch_params": epochs.params,
        "epochs_run": trainer.current_epoch,
        "should_stop": bool(trainer.should_stop),
        "completed": bool(growth.controller.completed) if growth.controller else None,
        "num_dendrites": growth.controller.num_dendrites if growth.controller else None,
        "widths": {n: m.num_neurons for n, m in
                   __import__("perfora").dendritic_layers(model).items()},
        "events": decisions,
        "global_step": trainer.global_step,
        "sharded": any(type(p).__name__ == "DTensor" for p in model.parameters()),
        "fed": {n: m.set_neurons() for n, m in
                __import__("perfora").dendritic_layers(model).items()},
        "logged": {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k.startswith("perfora/")},
    }
    if args.evaluate_checkpoints:
        record["evaluated"] = evaluate_checkpoints(args, trainer, model, val, out / "ckpt",
                                                  max(epochs.params))
        record["epoch_metrics"] = epochs.metrics
    rank = int(os.environ.get("LOCAL_RANK", trainer.global_rank))
    torch.save(record, out / f"rank{rank}.pt")
    if rank == 0:
        (out / "done.json").write_text(json.dumps({"epochs_run": record["epochs_run"]}))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # both ranks have written their records: leave together
        # as a user's script ends: the group torn down, the interpreter left normally
        # (perfora settles gloo's threads at exit, so no rank aborts)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
