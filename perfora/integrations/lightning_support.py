"""Helpers of the Lightning callback that need no Lightning import: the fresh optimizer's
primed state (FSDP2), the strategy's schedulers, DeepSpeed's re-initialization, and this
callback's entry in a saved checkpoint."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError


def prime_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create a fresh optimizer's state as if it had never stepped (step counts at 0).

    Saving a checkpoint under FSDP2 (``get_optimizer_state_dict``) initializes an empty
    optimizer by stepping it once with zero gradients, which leaves Adam's step count at 1
    and shrinks its first real update to 0.74 of the learning rate. After every restructure
    a new optimizer is empty, so perfora initializes it here and resets the step counts:
    the first real update is then the same as a fresh optimizer's."""
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]
              if p.requires_grad]
    if not params or any(p.grad is not None for p in params):
        return
    lrs = [group.get("lr") for group in optimizer.param_groups]
    for p in params:
        p.grad = torch.zeros_like(p)
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs):
        if lr is not None:
            group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    for state in optimizer.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            state["step"] = torch.zeros_like(step)
        elif step is not None:
            state["step"] = 0


def strategy_schedulers(strategy: Any) -> list[Any]:
    """The LR schedulers ``configure_optimizers`` gave the strategy."""
    return [config.scheduler for config in strategy.lr_scheduler_configs]


def zero_stage(strategy: Any) -> int:
    config = strategy.config if isinstance(getattr(strategy, "config", None), dict) else {}
    return int((config.get("zero_optimization") or {}).get("stage", 0))


def reinitialize_deepspeed(strategy: Any) -> None:
    """A new DeepSpeed engine (ZeRO 0-2) over the grown module and a new optimizer.

    The old engine's gradient hooks are removed first (``engine.destroy()``), then
    Lightning's own training initialization runs again: ``configure_optimizers`` and
    ``deepspeed.initialize``. (Not ``init_deepspeed``: during validation it would build an
    inference engine.)"""
    engine = strategy.model
    destroy = getattr(engine, "destroy", None)
    if callable(destroy):
        destroy()
    strategy.model = strategy.lightning_module
    strategy._initialize_deepspeed_train(strategy.model)


def callback_entry(callbacks: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """This callback's state among a checkpoint's callbacks: under ``key``, else the only
    DendriteGrowth entry (a Trainer for test/predict may monitor another metric)."""
    if key in callbacks:
        return callbacks[key]
    ours = [v for k, v in callbacks.items() if k.startswith("DendriteGrowth")]
    return ours[0] if len(ours) == 1 else None


def saved_callback_state(path: Path, key: str) -> dict[str, Any] | None:
    """This callback's entry in a Lightning checkpoint: one file, a distributed checkpoint
    folder (``meta.pt`` holds everything but the shards) or a DeepSpeed folder.

    Read with ``torch.load(weights_only=True)``, as Lightning itself reads a checkpoint by
    default: tensors and plain containers only, never code. A checkpoint holding other
    objects raises CheckpointError."""
    source = path
    if path.is_dir():
        deepspeed_files = sorted((path / "checkpoint").glob("mp_rank_*_model_states.pt"))
        source = deepspeed_files[0] if deepspeed_files else path / "meta.pt"
    if not source.exists():
        return None
    try:
        checkpoint = torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{source}: perfora reads the dendrite structure from a Lightning checkpoint "
            "with torch.load(weights_only=True) and never unpickles code, but this one holds "
            "other objects. Register classes you trust with "
            f"torch.serialization.add_safe_globals([...]) before fit. ({exc})") from None
    return checkpoint.get("callbacks", {}).get(key)
