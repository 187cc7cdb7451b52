"""Zoo models (tests/support/zoo.py) grown under DistributedDataParallel, for 2 ranks as
torchrun starts them: GPT-2 (its Conv1D layers) and ResNet (batch norm), one after the other.
The ranks start from different weights, train on different data and grow with different
seeds. Writes result_<rank>.json into OUT: per model, whether growth left the output
unchanged, the largest parameter difference between ranks at growth and after training,
and the losses."""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import perfora
from tests.support.zoo import ZooModel, feed, hf_models

MODELS = ["gpt2", "hf-resnet"]
STEPS = 2


def _zoo(name: str) -> ZooModel:
    return next(z for z in hf_models() if z.name == name)


def _rank_batch(zoo: ZooModel, rank: int) -> dict[str, torch.Tensor]:
    """The entry's batch, made different on each rank (so gradients must be averaged)."""
    batch = zoo.inputs()
    if "input_ids" in batch:
        batch["input_ids"] = (batch["input_ids"] + rank) % 64
    if "pixel_values" in batch:
        batch["pixel_values"] = batch["pixel_values"] + 0.5 * rank
    return batch


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _rank_diff(model: torch.nn.Module) -> float:
    """Largest difference of any parameter between the ranks (0.0 when identical)."""
    flat = _flat(model)
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return max((g - gathered[0]).abs().max().item() for g in gathered)


def _output(zoo: ZooModel, model: torch.nn.Module) -> torch.Tensor:
    fed, args = feed(zoo, model)
    model.eval()
    with torch.no_grad():
        out = fed(*args)
    model.train()
    return out


def _train(zoo: ZooModel, ddp: torch.nn.Module, opt: torch.optim.Optimizer,
           rank: int) -> list[float]:
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = zoo.loss(ddp, _rank_batch(zoo, rank))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _gathered(t: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return out


def grow_under_ddp(rank: int, name: str) -> dict:
    """Start weights shifted by rank (DDP broadcasts rank 0's), train, grow one set
    with a per-rank seed (the new wrapper broadcasts rank 0's), train again."""
    zoo = _zoo(name)
    started = time.perf_counter()
    torch.manual_seed(100 + rank)
    model = perfora.perforate(zoo.build(), **zoo.perforate_kwargs)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * rank)
    ddp = DDP(model.train())
    ctl = perfora.GrowthController(ddp, max_dendrites=2, dendrite_init="default", seed=rank,
                                   write_files=False)
    ctl.set_optimizer(torch.optim.SGD, lr=0.01)
    opt, _ = ctl.build_optimizer()
    losses = _train(zoo, ddp, opt, rank)
    before = _output(zoo, model)
    decision = ctl.add_dendrites()
    ddp, opt = decision.model, decision.optimizer
    inner = perfora.unwrap_model(ddp)
    at_growth = _output(zoo, inner)
    diff_at_growth = _rank_diff(inner)
    losses += _train(zoo, ddp, opt, rank)
    # rank 0's buffers (batch-norm statistics) are the ones the new wrapper broadcasts
    outputs = _gathered(at_growth)
    return {"unchanged": torch.equal(before, at_growth),
            "outputs_agree": all(torch.equal(o, outputs[0]) for o in outputs),
            "diff_at_growth": diff_at_growth, "seconds": time.perf_counter() - started,
            "diff_after": _rank_diff(inner), "new_wrapper": isinstance(ddp, DDP),
            "dendrites": sorted({layer.num_dendrites
                                 for layer in perfora.dendritic_layers(inner).values()}),
            "losses": losses}


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    result = {name: grow_under_ddp(rank, name) for name in MODELS}
    (out / f"result_{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
