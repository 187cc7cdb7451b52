"""An Accelerate loop (2 CPU processes under torchrun) that grows dendrites in process,
saves its state mid-run and, with ``--resume``, continues from it.

Writes result_<rank>.json: decisions, dendrite count, a parameter digest.
``--stale`` keeps the first prepared model (the negative control); ``--user-scheduler`` steps
a per-batch warm-up of its own, moved onto each rebuilt optimizer by prepare_after_growth."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

import perfora
from perfora.integrations import accelerate as perfora_accelerate

EPOCHS, SAVE_AFTER, BATCHES = 7, 4, 3


def warmup(step: int) -> float:
    """The user's per-batch schedule: a linear warm-up over 10 batches, then a decay."""
    return (step + 1) / 10 if step < 10 else 0.9 ** (step - 9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--stale", action="store_true")
    parser.add_argument("--growth", default="dendrites", help="dendrites, neurons or auto")
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--user-scheduler", action="store_true")
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
    start, scheduler = 0, None
    if args.resume is not None:
        if args.user_scheduler:
            scheduler = LambdaLR(ctl.build_optimizer()[0], warmup)
            prepared, optimizer, scheduler, _ = perfora_accelerate.load_state(
                accelerator, ctl, args.resume, scheduler)
        else:
            prepared, optimizer, _ = perfora_accelerate.load_state(accelerator, ctl, args.resume)
        start = ctl.epoch
    elif args.user_scheduler:
        first = ctl.build_optimizer()[0]
        prepared, optimizer, scheduler = accelerator.prepare(model, first, LambdaLR(first, warmup))
    else:
        prepared, optimizer = accelerator.prepare(model, ctl.build_optimizer()[0])
    actions, lrs = [], []
    for epoch in range(start, EPOCHS):
        for _ in range(BATCHES):
            optimizer.zero_grad()
            accelerator.backward(F.cross_entropy(prepared(x), y))
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        decision = ctl.step(1.0)  # a flat score: a new set every few epochs
        actions.append(decision.action)
        if decision.restructured or decision.complete:
            accelerator.print(f"epoch {ctl.epoch}: {decision.reason}")  # once, on rank 0
        if decision.restructured:
            if args.stale:
                optimizer = accelerator.prepare(decision.optimizer)
            elif scheduler is not None:
                prepared, optimizer, scheduler = perfora_accelerate.prepare_after_growth(
                    accelerator, decision, scheduler)
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
        "models_held": len(accelerator._models), "optimizers_held": len(accelerator._optimizers),
        "schedulers_held": len(accelerator._schedulers), "lrs": lrs}))
    # a user's script ends this way: the group torn down, the interpreter left normally
    # (perfora settles gloo's threads at exit, so no rank aborts; tests/integration/launch)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
