"""What ``wrap_deepspeed`` accepts: the DeepSpeed config, the optimizer recipe, the model.

Pure checks (no DeepSpeed import), each refusal naming what to do instead. perfora rebuilds
the DeepSpeed engine after every restructure, so it needs a recipe for the optimizer (the
parameters are replaced), a config whose parameters live where perfora can reach them (no
offload, no hpZ/MiCS secondary partitions, no quantized weights), and a model it can still
convert (not built under ``deepspeed.zero.Init``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, ParallelError

_QUANTIZED = ("zero_quantized_weights", "zero_quantized_nontrainable_weights",
              "zero_quantized_gradients")


def load_config(config: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """The DeepSpeed config as a dict (a JSON file's path is read)."""
    if isinstance(config, str | Path):
        try:
            return json.loads(Path(config).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the DeepSpeed config {config}: {exc}") from exc
    if not isinstance(config, Mapping):
        raise ConfigError(f"the DeepSpeed config must be a dict or a JSON file's path, got "
                          f"{type(config).__name__}")
    return json.loads(json.dumps(dict(config)))  # a deep copy; refuses what JSON cannot hold


def zero_stage(config: Mapping[str, Any]) -> int:
    """The ZeRO stage the config asks for (0 without a zero_optimization section)."""
    return int(dict(config.get("zero_optimization") or {}).get("stage", 0))


def _offloaded(section: Any) -> bool:
    if not isinstance(section, Mapping):
        return bool(section)
    return str(section.get("device", "none")).lower() not in ("none", "")


def check_config(config: Mapping[str, Any]) -> None:
    """Refuse (ParallelError) what perfora cannot restructure under DeepSpeed."""
    zero = dict(config.get("zero_optimization") or {})
    stage = zero_stage(config)
    if stage not in (0, 1, 2, 3):
        raise ParallelError(f"zero_optimization.stage={stage}: DeepSpeed has ZeRO stages 0-3")
    for key in ("offload_param", "offload_optimizer"):
        if _offloaded(zero.get(key)):
            raise ParallelError(
                f"zero_optimization.{key} (CPU/NVMe offload) is not supported by perfora: a "
                "restructure reads and replaces the parameters where the engine keeps them, and "
                "offloaded copies would go stale; drop the offload section (use more ranks, "
                "or ZeRO-3 without offload, to fit the model)")
    if int(zero.get("zero_hpz_partition_size", 1) or 1) > 1:
        raise ParallelError("zero_hpz_partition_size > 1 (ZeRO++ hpZ) keeps a secondary "
                            "partition of every parameter that perfora does not rebuild "
                            "after growth; set it to 1")
    if int(zero.get("mics_shard_size", -1) or -1) > 0:
        raise ParallelError("mics_shard_size (MiCS) shards over sub-groups perfora does not "
                            "rebuild after growth; remove it (plain ZeRO-3 shards over all "
                            "ranks)")
    for key in _QUANTIZED:
        if zero.get(key):
            raise ParallelError(f"zero_optimization.{key}: perfora grows layers from their "
                                "exact weights (growth must leave the outputs unchanged), "
                                "which quantized weights or gradients do not give; set it "
                                "to false")


def check_optimizer(optimizer: Any, config: Mapping[str, Any]) -> None:
    """Refuse an optimizer instance, or no optimizer at all (neither recipe nor section)."""
    if isinstance(optimizer, torch.optim.Optimizer) or hasattr(optimizer, "param_groups"):
        raise ParallelError(
            "wrap_deepspeed got an optimizer instance: growth replaces the model's "
            "parameters, so perfora builds a new optimizer after every restructure. Pass "
            "the recipe instead: optimizer=torch.optim.AdamW, optimizer_args={'lr': 1e-3} "
            "(or any callable params -> optimizer), or an 'optimizer' section in the config")
    if optimizer is None and "optimizer" not in config:
        raise ParallelError("wrap_deepspeed needs an optimizer: pass optimizer=<class or "
                            "callable> (and optimizer_args=), or an 'optimizer' section in "
                            "the DeepSpeed config")
    if optimizer is not None and "optimizer" in config:
        raise ParallelError("give the optimizer either as optimizer= or as the config's "
                            "'optimizer' section, not both")
    if optimizer is not None and not callable(optimizer):
        raise ParallelError(f"optimizer= must be an optimizer class or a callable params -> "
                            f"optimizer, got {type(optimizer).__name__}")


def check_scheduler(lr_scheduler: Any) -> None:
    """Refuse a scheduler instance: it holds the optimizer growth replaces."""
    if lr_scheduler is not None and (hasattr(lr_scheduler, "optimizer")
                                     or not callable(lr_scheduler)):
        raise ParallelError("wrap_deepspeed got a scheduler instance: it holds the "
                            "optimizer that growth replaces. Pass lr_scheduler=<class or "
                            "callable optimizer -> scheduler> (and lr_scheduler_args=), or "
                            "a 'scheduler' section in the config")


def check_model_parameters(model_parameters: Any) -> None:
    """Refuse a fixed list of parameters: growth adds and replaces parameters."""
    if model_parameters is not None and not callable(model_parameters):
        raise ParallelError("model_parameters= must be a callable module -> parameters (or "
                            "parameter groups), e.g. lambda m: m.parameters(): growth "
                            "replaces the parameters, so a fixed list would miss the "
                            "dendrites")


def is_deepspeed_engine(model: nn.Module) -> bool:
    """True for a DeepSpeed engine (any subclass), without importing DeepSpeed."""
    return any(cls.__name__ == "DeepSpeedEngine" for cls in type(model).__mro__)


def is_partitioned(model: nn.Module) -> bool:
    """True when DeepSpeed partitioned any of the parameters (``zero.Init`` or an engine)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def check_model(model: nn.Module) -> None:
    """Refuse a model whose parameters DeepSpeed already partitioned (``zero.Init``) or an
    engine (perfora builds the engine itself)."""
    if any(is_deepspeed_engine(m) for m in model.modules()):
        raise ParallelError("wrap_deepspeed got a DeepSpeed engine: give it the perforated "
                            "model itself; perfora calls deepspeed.initialize (and again "
                            "after every restructure)")
    if is_partitioned(model):
        raise ParallelError(
            "the model's parameters are already partitioned by DeepSpeed (built under "
            "deepspeed.zero.Init): perforate and wrap a model built without zero.Init; "
            "perfora partitions it in wrap_deepspeed, and after growth one layer at a time")


def recipe(factory: Callable | None, args: Mapping[str, Any] | None) -> Callable | None:
    """``factory`` with ``args`` bound: the callable DeepSpeed calls to build it."""
    if factory is None:
        return None
    kwargs = dict(args or {})
    if not kwargs:
        return factory

    def build(target: Any) -> Any:
        return factory(target, **kwargs)

    return build
