"""Helpers of the Lightning callback that need no Lightning import: the fresh optimizer's
primed state (FSDP2), the strategy's schedulers, DeepSpeed's re-initialization, this
callback's entry in a saved checkpoint, and :func:`load_grown_checkpoint`."""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..config import PerforaConfig
from ..errors import CheckpointError, PerforaError
from ..growth.neuron_growth import widening_targets
from ..nn.perforation import fit_structure


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


def reinitialize_deepspeed(strategy: Any, *, train: bool = True) -> None:
    """A new DeepSpeed engine (ZeRO 0-2) over the grown module and a new optimizer.

    The old engine's gradient hooks are removed first (``engine.destroy()``), then
    Lightning's own initialization runs again: for training, ``configure_optimizers`` and
    ``deepspeed.initialize`` (not ``init_deepspeed``: during validation it would build an
    inference engine); with ``train=False`` (test, validate, predict), the inference engine."""
    engine = strategy.model
    destroy = getattr(engine, "destroy", None)
    if callable(destroy):
        destroy()
    strategy.model = strategy.lightning_module
    if train:
        strategy._initialize_deepspeed_train(strategy.model)
    else:
        strategy._initialize_deepspeed_inference(strategy.model)


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


def load_grown_checkpoint(module_class: type, checkpoint_path: str | Path, *,
                          map_location: Any = None, **kwargs: Any) -> Any:
    """``module_class.load_from_checkpoint`` for a checkpoint of a fit that grew.

    Lightning's own ``load_from_checkpoint`` builds the module as ``__init__`` does, without
    the dendrites and neurons the checkpoint holds, and fails on the missing and resized
    keys. This builds it, gives the grown submodule the saved structure, then loads every
    weight strictly. ``kwargs`` go to ``load_from_checkpoint`` (hyperparameters to
    override). A checkpoint without a DendriteGrowth entry loads as Lightning loads it.

    The file is memory-mapped and only the weights are read: the optimizer and scheduler
    states and the callbacks' entries (perfora's holds a best-model snapshot) are never
    loaded, so a checkpoint several times the model's size loads in about the model's
    memory. The module's ``on_load_checkpoint`` sees every other entry."""
    path = Path(checkpoint_path)
    checkpoint = _load_mapped(path)
    saved = callback_entry(checkpoint.get("callbacks") or {}, "")
    if not saved or not saved.get("structure"):
        return module_class.load_from_checkpoint(path, map_location=map_location, **kwargs)
    bare = io.BytesIO()  # built and hooked as Lightning does; the weights are set below
    torch.save({**{k: v for k, v in checkpoint.items() if k not in _TRAINING_STATE},
                "state_dict": {}}, bare)  # (their shapes differ from a fresh module's)
    bare.seek(0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(contains no parameters|Found keys that)")
        model = module_class.load_from_checkpoint(bare, map_location=map_location,
                                                  strict=False, **kwargs)
    module = saved.get("module", _grown_module(checkpoint["state_dict"], saved["structure"]))
    target = model.get_submodule(module) if module else model
    fit_structure(target, saved["structure"], str(path))
    model.load_state_dict(checkpoint["state_dict"])  # strict: every key, every shape
    return model


_TRAINING_STATE = ("state_dict", "optimizer_states", "lr_schedulers", "callbacks")
"""A checkpoint's entries a module loaded for use does not need from Lightning's loader."""


def _load_mapped(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path`` with its tensors memory-mapped (read from the file when
    used); a checkpoint in torch's legacy (non-zip) format is read whole."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc):
            raise
        return torch.load(path, map_location="cpu", weights_only=True)


def _grown_module(state: Mapping[str, Any], structure: Mapping[str, Any]) -> str | None:
    """The attribute path of the grown submodule, read off the state's keys (checkpoints
    saved before the callback recorded its ``module``)."""
    layer = next(iter(structure))
    for key in state:
        head, found, _ = key.partition(f".{layer}.")
        if found:
            return head
        if key.startswith(f"{layer}."):
            return None
    return None


def refuse_fused_neurons_when_spawned(target: torch.nn.Module, config: PerforaConfig,
                                      strategy_name: str) -> None:
    """Before a spawned fit trains: the launching process gets the trained weights back
    through ``load_state_dict``, which cannot say in which steps a fused gate-and-up layer
    (Phi-3's ``gate_up_proj``) gained neurons, so such a run could only fail at its end."""
    if config.growth == "dendrites" or config.max_neuron_steps == 0:
        return
    fused = [path for path, entry in widening_targets(target, config.neuron_pairs).items()
             if entry.chunks > 1]
    if fused:
        raise PerforaError(
            f"strategy {strategy_name} hands the trained weights back to the launching "
            "process with load_state_dict, and the fused gate-and-up layer"
            f"{'s' if len(fused) > 1 else ''} {', '.join(fused[:3])} would gain neurons in "
            "steps a state dict does not record, so the run would fail when it ends. Use "
            "strategy='ddp' (the launcher starts each rank as a process of its own), or "
            "growth='dendrites' (or max_neuron_steps=0)")
