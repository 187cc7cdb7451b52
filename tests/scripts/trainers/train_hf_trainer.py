"""A Hugging Face Trainer run (2 CPU processes under torchrun, gloo) that grows dendrites in
process through DendriteGrowthCallback, with gradient accumulation (its no_sync steps).

Writes result_<rank>.json: decisions, dendrite count, a parameter digest, what the Trainer
and its accelerator hold after growth. ``--stale`` keeps the first DDP wrapper (only the
optimizer is rebuilt): the negative control."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from hf_tiny import Blobs, digest, make_trainer  # noqa: E402

from perfora.integrations.transformers import DendriteGrowthCallback  # noqa: E402


class StaleWrapper(DendriteGrowthCallback):
    """The negative control: a new optimizer, but the old DDP wrapper kept."""

    def _prepare(self, trainer: Any, inner: nn.Module, optimizer: Any) -> tuple[nn.Module, Any]:
        return trainer.model_wrapped, trainer.accelerator.prepare(optimizer)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--stale", action="store_true")
    parser.add_argument("--growth", default="dendrites", help="dendrites, neurons or auto")
    args = parser.parse_args()
    torch.set_num_threads(1)
    trainer = make_trainer(str(args.out / "trainer"), epochs=5, train=Blobs(128, 1),
                           ddp_backend="gloo", gradient_accumulation_steps=2)
    rank = trainer.args.process_index
    cls = StaleWrapper if args.stale else DendriteGrowthCallback
    # the run ends before completion: keep the last (grown) model, whose ranks are compared,
    # instead of the best snapshot (restore_best_at_end is tested in process)
    growth = cls(monitor="eval_loss", patience=1, max_dendrites=3, seed=0,
                 improvement_threshold=0.5, dendrite_init="default", growth=args.growth,
                 restore_best_at_end=False).bind(trainer)
    trainer.train()
    ctl = growth.controller
    assert ctl is not None
    wrapped = trainer.model_wrapped
    # the parameters whose gradients the wrapper averages: those of its construction
    ddp_params = {id(p) for p in getattr(wrapped, "_module_parameters", [])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"result_{rank}.json").write_text(json.dumps({
        "actions": [row["event"] for row in ctl.state.history],
        "dendrites": ctl.num_dendrites, "widenings": ctl.state.num_widenings,
        "digest": digest(trainer.model),
        "ddp": isinstance(wrapped, nn.parallel.DistributedDataParallel),
        "ddp_covers_model": all(id(p) in ddp_params for p in trainer.model.parameters()),
        "models_held": len(trainer.accelerator._models),
        "optimizers_held": len(trainer.accelerator._optimizers)}))
    if torch.distributed.is_initialized():  # a user's script ends this way: exits 0
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
