"""An Accelerate loop (2 CPU processes under torchrun) that grows dendrites in process,
saves its state mid-run and, with ``--resume``, continues from it.

Writes result_<rank>.json: decisions, dendrite count, a parameter digest.
``--stale`` keeps the first prepared model (the negative control)."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn

import perfora
from perfora.integrations import accelerate as perfora_accelerate

EPOCHS, SAVE_AFTER = 7, 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--stale", action="store_true")
    parser.add_argument("--growth", default="dendrites", help="dendrites, neurons or auto")
    parser.add_argument("--resume", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)))
    ctl = perfora.GrowthController(model, seed=0, dendrite_init="default", growth=args.growth,
                                   n_epochs_to_switch=2, max_dendrites=5)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    x = torch.randn(64, 6, generator=generator)
    y = torch.randint(0, 3, (64,), generator=generator)
    start = 0
    if args.resume is not None:
        prepared, optimizer, _ = perfora_accelerate.load_state(accelerator, ctl, args.resume)
        start = ctl.epoch
    else:
        prepared, optimizer = accelerator.prepare(model, ctl.build_optimizer()[0])
    actions = []
    for epoch in range(start, EPOCHS):
        for _ in range(3):
            optimizer.zero_grad()
            accelerator.backward(F.cross_entropy(prepared(x), y))
            optimizer.step()
        decision = ctl.step(1.0)  # a flat score: a new set every few epochs
        actions.append(decision.action)
        if decision.restructured or decision.complete:
            accelerator.print(f"epoch {ctl.epoch}: {decision.reason}")  # once, on rank 0
        if decision.restructured:
            if args.stale:
                optimizer = accelerator.prepare(decision.optimizer)
            else:
                prepared, optimizer = perfora_accelerate.prepare_after_growth(accelerator,
                                                                              decision)
        if epoch + 1 == SAVE_AFTER and args.resume is None:
            perfora_accelerate.save_state(accelerator, ctl, args.out / "state")
    digest = hashlib.sha256()
    for _, p in sorted(model.state_dict().items()):
        digest.update(p.detach().contiguous().numpy().tobytes())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"result_{rank}.json").write_text(json.dumps({
        "actions": actions, "dendrites": ctl.num_dendrites, "digest": digest.hexdigest(),
        "widenings": ctl.state.num_widenings,
        "models_held": len(accelerator._models), "optimizers_held": len(accelerator._optimizers)}))
    # a user's script ends this way: the group torn down, the interpreter left normally
    # (perfora settles gloo's threads at exit, so no rank aborts; tests/integration/launch)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
