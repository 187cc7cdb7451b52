"""The README's in-process DDP growth loop, for any number of nodes under torchrun.

Every rank trains on its own data; growth is decided from scores averaged over ranks.
Writes result_<rank>.json (decisions, dendrites, parameter digest) into OUT.
``--fsdp2`` shards the model with FSDP2 instead of wrapping it in DDP."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import perfora
from perfora.parallel.sharded_state import full_state_dict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--fsdp2", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)))
    wrapped = perfora.shard_fsdp2(model) if args.fsdp2 else perfora.wrap_ddp(model)
    ctl = perfora.GrowthController(wrapped, seed=0, dendrite_init="default", maximize=False,
                                   n_epochs_to_switch=2, max_dendrites=2, growth="dendrites")
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    optimizer, _ = ctl.build_optimizer()
    generator = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(64, 6, generator=generator)
    y = torch.randint(0, 3, (64,), generator=generator)
    # a loss that improves after each growth: two restructures, then completion at K=2
    actions, scores = [], [1.0, 1.0, 1.0, 0.9, 0.9, 0.9, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8]
    for score in scores:
        for _ in range(3):
            optimizer.zero_grad()
            F.cross_entropy(wrapped(x), y).backward()
            optimizer.step()
        decision = ctl.step(score - 0.01 * rank, model=wrapped)
        actions.append(decision.action)
        wrapped, optimizer = decision.model, decision.optimizer
        if decision.complete:
            break
    full = full_state_dict(wrapped) if args.fsdp2 else \
        perfora.unwrap_model(wrapped).state_dict()
    digest = hashlib.sha256()
    for _, p in sorted(full.items()):
        digest.update(p.detach().contiguous().numpy().tobytes())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"result_{rank}.json").write_text(json.dumps({
        "world": world, "node": os.environ.get("GROUP_RANK"), "actions": actions,
        "dendrites": ctl.num_dendrites, "additions": ctl.state.additions,
        "digest": digest.hexdigest()}))
    # leave together, as a user's script ends (perfora makes the teardown exit 0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
