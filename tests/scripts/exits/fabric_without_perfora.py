"""The Fabric DDP loop of ``tests/scripts/trainers/train_fabric.py`` without perfora: the same
model, data and steps in ``main()``, then ``barrier()``, ``destroy_process_group()`` and a
normal return. The control of ``benchmarks/fabric_exit.py``: torch's hang at that return
does not need perfora.

Run: ``torchrun --nproc_per_node 2 fabric_without_perfora.py OUT``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    rank = fabric.global_rank
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fabric_model, optimizer = fabric.setup(model, optimizer)
    generator = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(64, 6, generator=generator)
    y = torch.randint(0, 3, (64,), generator=generator)
    for _ in range(7):
        for _ in range(3):
            optimizer.zero_grad()
            fabric.backward(F.cross_entropy(fabric_model(x), y))
            optimizer.step()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"result_{rank}.json").write_text(json.dumps({"rank": rank}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
