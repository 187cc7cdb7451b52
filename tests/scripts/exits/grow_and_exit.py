"""A user's torchrun script: grow (or load) a run under FSDP2 or DDP, then exit normally.

``grow`` trains a small MLP until it has grown once (the run writes ``latest``); ``load``
loads that run into a freshly built model and trains a step. ``load`` ends the way a user's
script does, with ``barrier()`` and ``destroy_process_group()``, written at module level
(the model and the controller live until the interpreter exits), and the process must exit
0: no ``os._exit``. ``grow`` prepares the run that the loads read and ends the same way.

Run: ``torchrun --nproc_per_node 3 grow_and_exit.py {grow,load} RUN_DIR
[--ddp]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import perfora

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["grow", "load"])
parser.add_argument("run_dir", type=Path)
parser.add_argument("--ddp", action="store_true", help="DDP instead of FSDP2")
args = parser.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
model = perfora.perforate(nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)))
wrapped = perfora.wrap_ddp(model) if args.ddp else perfora.shard_fsdp2(model)
ctl = perfora.GrowthController(wrapped, seed=0, dendrite_init="default", maximize=False,
                               n_epochs_to_switch=2, max_dendrites=2,
                               run_dir=str(args.run_dir), checkpoint_time_budget=None)
ctl.set_optimizer(torch.optim.Adam, lr=0.01)
generator = torch.Generator().manual_seed(100 + rank)
x = torch.randn(32, 6, generator=generator)
y = torch.randint(0, 3, (32,), generator=generator)
if args.mode == "grow":
    optimizer, _ = ctl.build_optimizer()
    for _ in range(6):  # a flat score: grows after n_epochs_to_switch epochs
        optimizer.zero_grad()
        F.cross_entropy(wrapped(x), y).backward()
        optimizer.step()
        decision = ctl.step(1.0, model=wrapped)
        wrapped, optimizer = decision.model, decision.optimizer
        if ctl.num_dendrites:
            break
else:
    decision = ctl.load("latest")
    wrapped, optimizer = decision.model, decision.optimizer
    optimizer.zero_grad()
    loss = F.cross_entropy(wrapped(x), y)
    loss.backward()
    optimizer.step()
if rank == 0:
    (args.run_dir / f"{args.mode}_result.json").write_text(
        json.dumps({"dendrites": ctl.num_dendrites}))
dist.barrier()
dist.destroy_process_group()
