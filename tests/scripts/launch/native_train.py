"""A DDP training script on perfora's native API, written for the restart workflow.

It exits 0 after every restructure (rank 0 has saved ``switch_N`` and ``latest``), resumes
from ``latest`` in ``--pai_load_folder`` when started again, and writes the completion
marker at the end. Run it with ``perfora launch --nproc-per-node 2 native_train.py --out DIR``.

Test hook (environment): ``NATIVE_TRAIN_KILL="RANK:EPOCH"`` SIGKILLs that rank halfway
through that epoch on the first attempt.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import perfora
from perfora.growth.restart import ATTEMPT_ENV, mark_training_complete

parser = argparse.ArgumentParser()
parser.add_argument("--perforate_model_parallel", action="store_true")
parser.add_argument("--pai_load_folder", type=str, default=None)
parser.add_argument("--save_name", default="PAI")
parser.add_argument("--out", required=True, help="folder for the per-rank result files")
parser.add_argument("--epochs_per_switch", type=int, default=3)
parser.add_argument("--max_dendrites", type=int, default=2)
parser.add_argument("--forget_marker", action="store_true",
                    help="do not call mark_training_complete (a script that forgot it)")
args = parser.parse_args()

torch.set_num_threads(1)
attempt = int(os.environ.get(ATTEMPT_ENV, "0"))
distributed = "RANK" in os.environ and not args.perforate_model_parallel
if distributed:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank() if distributed else 0
world = dist.get_world_size() if distributed else 1
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)


def log(event: str, **fields) -> None:
    """One JSON line per event, rank 0 only."""
    if rank == 0:
        with open(out / "events.jsonl", "a") as handle:
            handle.write(json.dumps({"attempt": attempt, "event": event, **fields}) + "\n")


# the same data on every rank; each rank trains on its own shard
gen = torch.Generator().manual_seed(0)
x = torch.randn(384, 8, generator=gen)
y = (x[:, :4].sum(1, keepdim=True).tanh() + 0.3 * x[:, 4:6].prod(1, keepdim=True))
x_train, y_train, x_val, y_val = x[:256], y[:256], x[256:], y[256:]
x_train, y_train = x_train[rank::world], y_train[rank::world]
x_val, y_val = x_val[rank::world], y_val[rank::world]

torch.manual_seed(1234 + rank)  # rank-dependent init on purpose: DDP must broadcast rank 0's
model = perfora.perforate(nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 1)))
run_dir = args.pai_load_folder or args.save_name
controller = perfora.GrowthController(
    model, maximize=False, switch_mode="fixed", fixed_switch_num=args.epochs_per_switch,
    max_dendrites=args.max_dendrites, retain_all_dendrites=True, growth="dendrites",
    checkpoint_time_budget=None, run_dir=run_dir)
controller.set_optimizer(torch.optim.Adam, lr=1e-2)

if args.perforate_model_parallel:  # the initialization run: one batch, then exit
    nn.functional.mse_loss(model(x_train[:32]), y_train[:32]).backward()
    log("init")
    raise SystemExit(0)

if args.pai_load_folder and (Path(args.pai_load_folder) / "latest.safetensors").is_file():
    optimizer = controller.load("latest").optimizer
else:
    optimizer, _ = controller.build_optimizer()
log("start", epoch=controller.epoch, dendrites=controller.num_dendrites)

net = nn.parallel.DistributedDataParallel(model) if distributed else model
kill = os.environ.get("NATIVE_TRAIN_KILL")
kill_rank, kill_epoch = (int(v) for v in kill.split(":")) if kill else (-1, -1)

while True:
    epoch = controller.epoch + 1
    net.train()
    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
    batches = order.split(16)
    for step, idx in enumerate(batches):
        if attempt == 1 and rank == kill_rank and epoch == kill_epoch \
                and step == len(batches) // 2:  # halfway through the epoch
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        nn.functional.mse_loss(net(x_train[idx]), y_train[idx]).backward()
        optimizer.step()
    net.eval()
    with torch.no_grad():
        val_loss = nn.functional.mse_loss(model(x_val), y_val).item()
    decision = controller.step(val_loss, weight=len(x_val))
    if decision.restructured or decision.complete:
        break

flat = torch.cat([p.detach().flatten() for p in model.parameters()])
with open(out / f"params_rank{rank}.json", "w") as handle:
    json.dump({"epoch": controller.epoch, "dendrites": controller.num_dendrites,
               "params": flat.tolist()}, handle)
if decision.complete and not args.forget_marker:
    mark_training_complete(run_dir)
log("complete" if decision.complete else "restructured", epoch=controller.epoch,
    dendrites=controller.num_dendrites)
if distributed:
    dist.barrier()  # rank 0's checkpoint and marker are on disk before anyone exits
    dist.destroy_process_group()  # as a user's script ends: perfora makes this exit 0
