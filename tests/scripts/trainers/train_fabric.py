"""A Fabric DDP loop (2 CPU ranks under torchrun) that grows dendrites in process.

Writes result_<rank>.json: the decisions, the dendrite count and a parameter digest.
``--stale`` keeps Fabric's first wrapper (the negative control)."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch import nn

import perfora
from perfora.integrations.fabric import setup_after_growth


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--stale", action="store_true")
    parser.add_argument("--growth", default="dendrites", help="dendrites, neurons or auto")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    rank = fabric.global_rank
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)))
    ctl = perfora.GrowthController(model, seed=0, dendrite_init="default", growth=args.growth,
                                   n_epochs_to_switch=2, max_dendrites=5)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    optimizer, _ = ctl.build_optimizer()
    fabric_model, optimizer = fabric.setup(model, optimizer)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    x = torch.randn(64, 6, generator=generator)
    y = torch.randint(0, 3, (64,), generator=generator)
    actions = []
    for _ in range(7):
        for _ in range(3):
            optimizer.zero_grad()
            fabric.backward(F.cross_entropy(fabric_model(x), y))
            optimizer.step()
        decision = ctl.step(1.0)  # a flat score: a new set every few epochs
        actions.append(decision.action)
        if decision.restructured or decision.complete:
            fabric.print(f"epoch {ctl.epoch}: {decision.reason}")  # once, on rank 0
        if decision.restructured:
            if args.stale:
                optimizer = fabric.setup_optimizers(decision.optimizer)
            else:
                fabric_model, optimizer = setup_after_growth(fabric, decision)
    digest = hashlib.sha256()
    for _, p in sorted(model.state_dict().items()):
        digest.update(p.detach().contiguous().numpy().tobytes())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"result_{rank}.json").write_text(json.dumps({
        "actions": actions, "dendrites": ctl.num_dendrites, "digest": digest.hexdigest(),
        "widenings": ctl.state.num_widenings,
        "newest_set_trained": bool(ctl.num_dendrites) and bool(
            perfora.dendritic_layers(model)["0"].out_weight[-1].detach().abs().sum() > 0)}))
    # a user's script ends this way: the group torn down, the interpreter left normally
    # (perfora settles gloo's threads at exit, so no rank aborts; tests/integration/launch)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
