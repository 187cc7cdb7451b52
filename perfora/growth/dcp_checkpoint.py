"""A controller to and from a DCP checkpoint folder: sharded tensors plus perfora's JSON.

Saving reads the model's and optimizer's state with
``torch.distributed.checkpoint.state_dict.get_state_dict`` (sharded: each rank keeps its
own shards, nothing is gathered) and writes them with DCP; the structure, controller,
rule and config go beside them in ``perfora.json`` (the same JSON a ``.safetensors``
checkpoint holds in its header). Loading fits the saved structure onto the model first,
re-shards or re-wraps it, then lets DCP cut the saved tensors to this run's shards, so a
run saved on N ranks resumes on any number of ranks (or in one process without a group).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._version import __version__
from ..checkpoint.dcp import (
    DCP_SUFFIX,
    Shapes,
    is_dcp_path,
    load_dcp,
    read_dcp,
    readable_path,
    save_dcp,
    written_at,
)
from ..checkpoint.model_state import shadow_copy
from ..checkpoint.schema import check_dict, check_list, check_str, validate_meta
from ..config import PerforaConfig
from ..distributed.collectives import is_distributed, world_size
from ..errors import CheckpointError, ConfigError, ShapeMismatchError
from ..nn.layers import unwrap_model
from ..nn.perforation import fit_structure, layer_specs
from ..parallel.base import ParallelBackend, optimizer_is_current
from ..parallel.sharded_state import FSDP1_KIND
from .rehearsal import checked_state, rehearse_rule
from .state import BestSnapshot

if TYPE_CHECKING:
    from .controller import GrowthController

FILE, DCP = "file", "dcp"
_SHARDED_TENSOR = "Please use DTensor instead"  # FSDP1's state dicts warn on every call


def resolve_format(setting: str, backend: ParallelBackend) -> str:
    """'file' or 'dcp' for this run: DCP needs more than one rank; 'auto' picks it for
    sharded models only."""
    if not is_distributed():
        return FILE
    if setting == DCP or (setting == "auto" and backend.auto_dcp):
        return DCP
    return FILE


def format_of(path: str | Path, setting: str, backend: ParallelBackend) -> str:
    """The format ``save(path)`` writes: ``.dcp`` and ``.safetensors`` names say it,
    any other name follows the setting."""
    suffix = Path(path).suffix
    if suffix == DCP_SUFFIX:
        return DCP
    if suffix == ".safetensors":
        return FILE
    return resolve_format(setting, backend)


def warn_single_process(setting: str) -> bool:
    """Warn (once per caller) that checkpoint_format='dcp' writes files in one process."""
    if setting != DCP or is_distributed():
        return False
    warnings.warn("checkpoint_format='dcp' needs a process group of more than one rank; "
                  "this single-process run writes single .safetensors checkpoints "
                  "(they load on any number of ranks too)", stacklevel=4)
    return True


def newest_checkpoint(paths: list[Path]) -> Path:
    """The most recently completed of the candidate paths (the first when none exists)."""
    found = [(t, -i, p) for i, p in enumerate(paths) if (t := written_at(p)) is not None]
    return max(found)[2] if found else paths[0]


# ----------------------------------------------------------------------------- saving
def _saves_optimizer(ctl: GrowthController) -> bool:
    """Whether the optimizer state goes into the checkpoint: an optimizer that holds state
    for the model's current parameters (FSDP1 keeps flat slices: not saved, as in files)."""
    opt = ctl.optimizer
    return (opt is not None and bool(opt.state) and ctl.backend.name != FSDP1_KIND
            and optimizer_is_current(opt, ctl.model))


def _state_module(ctl: GrowthController) -> nn.Module:
    """The module ``get_state_dict`` reads: the FSDP root when sharded, else the bare one."""
    return ctl.model if ctl.backend.sharded else unwrap_model(ctl.model)


def _split_optimizer(optim_sd: Mapping[str, Any]) -> tuple[dict, dict]:
    """A by-name optimizer state as (tensors {fqn: {key: t}}, JSON: groups + other values)."""
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    plain: dict[str, dict[str, Any]] = {}
    for fqn, entry in optim_sd["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors.setdefault(fqn, {})[key] = value
            else:
                plain.setdefault(fqn, {})[key] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()}
              for group in optim_sd["param_groups"]]
    return tensors, {"state": plain, "param_groups": groups}


def _join_optimizer(tensors: Mapping[str, Mapping[str, torch.Tensor]],
                    saved: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`_split_optimizer`: the by-name state ``set_state_dict`` takes."""
    plain = saved.get("state", {})
    state = {fqn: {**plain.get(fqn, {}), **entry} for fqn, entry in tensors.items()}
    groups = [{k: (tuple(v) if isinstance(v, list) and k != "params" else v)
               for k, v in group.items()} for group in saved["param_groups"]]
    return {"state": state, "param_groups": groups}


def dcp_state(ctl: GrowthController, model_from_best: bool = False
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors by group, JSON meta) of a DCP checkpoint: this rank's shards, nothing gathered."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    module = _state_module(ctl)
    rows = ctl.config.history_lookback if ctl._writer.report is not None else None
    meta: dict[str, Any] = {"structure": layer_specs(unwrap_model(ctl.model)),
                            **ctl.state_dict(history_rows=rows),
                            "perfora_version": __version__, "world_size": world_size(),
                            "parallel": ctl.backend.name}
    optimizers = [ctl.optimizer] if _saves_optimizer(ctl) else []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SHARDED_TENSOR)
        model_sd, optim_sd = get_state_dict(module, optimizers)
    tensors: dict[str, Any] = {"model": dict(model_sd)}
    best = ctl._best
    if model_from_best and best is not None:
        if best.structure != meta["structure"]:
            optimizers = []  # the moments belong to the grown model, not the best one
        meta["structure"], tensors["model"] = best.structure, dict(best.tensors)
    if best is not None:
        tensors["best"] = dict(best.tensors)
        meta["best_structure"] = best.structure
    if optimizers:
        tensors["optim"], meta["optimizer"] = _split_optimizer(optim_sd)
        meta["optimizer_class"] = type(ctl.optimizer).__qualname__
    if ctl.scheduler is not None:
        from .persistence import _jsonable_or_none

        meta["scheduler"] = _jsonable_or_none(ctl.scheduler.state_dict())
    return tensors, meta


def save_dcp_checkpoint(ctl: GrowthController, path: str | Path,
                        model_from_best: bool = False) -> None:
    """Write ``path`` as a DCP folder (a collective: call it on every rank)."""
    _check_dcp(ctl)
    tensors, meta = dcp_state(ctl, model_from_best)
    save_dcp(path, tensors, meta)


# ----------------------------------------------------------------------------- loading
def read_checkpoint(path: str | Path) -> tuple[Path, dict[str, Any], Shapes, Any]:
    """(folder, checked meta, tensor shapes, DCP metadata) of a controller DCP checkpoint."""
    path = readable_path(path)
    meta, shapes, metadata = read_dcp(path)
    source = str(path)
    for key in ("controller", "config", "structure"):
        if key not in meta:
            raise CheckpointError(f"{source}: {key}: missing (not a controller checkpoint)")
    optimizer = meta.pop("optimizer", None)
    try:
        validate_meta(meta, {k: {n: s for n, (s, _) in v.items()} for k, v in shapes.items()})
        if optimizer is not None:
            _check_optimizer_meta(optimizer, shapes.get("optim", {}))
        elif "optim" in shapes:
            raise CheckpointError("optimizer: missing, but the folder holds optimizer tensors")
        PerforaConfig.from_dict(meta["config"])
    except ConfigError as exc:
        raise CheckpointError(f"{source}: config: {exc}") from exc
    except CheckpointError as exc:
        raise CheckpointError(f"{source}: {exc}") from None
    if optimizer is not None:
        meta["optimizer"] = optimizer
    checked_state(meta["controller"], source)
    return path, meta, shapes, metadata


def _check_optimizer_meta(data: Any, tensors: Mapping[str, Any]) -> None:
    """The JSON half of a by-name optimizer state: groups listing parameter names once."""
    data = check_dict(data, "optimizer")
    seen: set[str] = set()
    for i, group in enumerate(check_list(data.get("param_groups"), "optimizer.param_groups")):
        group = check_dict(group, f"optimizer.param_groups[{i}]")
        for j, name in enumerate(check_list(group.get("params"),
                                            f"optimizer.param_groups[{i}].params")):
            check_str(name, f"optimizer.param_groups[{i}].params[{j}]")
            if name in seen:
                raise CheckpointError(f"optimizer.param_groups[{i}].params[{j}]: {name!r} "
                                      "is listed twice")
            seen.add(name)
    check_dict(data.get("state", {}), "optimizer.state")
    for key in tensors:
        if not any(key.startswith(f"{name}.") for name in seen):
            raise CheckpointError(f"optimizer tensor {key!r} belongs to no parameter group")


def _weightless(ctl: GrowthController) -> nn.Module | None:
    """A weightless copy to check the structure on: the model's, or the FSDP template's."""
    if not ctl.backend.sharded:
        return ctl.backend.shadow(ctl.model)
    template = ctl.backend.template
    return shadow_copy(template) if template is not None else None


def check_fits(shadow: nn.Module, meta: Mapping[str, Any], shapes: Shapes, source: str,
               config: PerforaConfig) -> None:
    """The saved structure, model tensors and rule state fitted to a weightless copy."""
    fit_structure(shadow, meta["structure"], source)
    own = {k: tuple(v.shape) for k, v in shadow.state_dict().items()}
    saved = {k: s for k, (s, _) in shapes.get("model", {}).items()}
    missing, unexpected = sorted(own.keys() - saved), sorted(saved.keys() - own)
    if missing or unexpected:
        raise ShapeMismatchError(f"{source} does not fit this model: missing {missing[:5]}, "
                                 f"unexpected {unexpected[:5]}. Build the model the same way "
                                 "as the run that saved it (same class and sizes)")
    for key, shape in own.items():
        if saved[key] != shape:
            raise ShapeMismatchError(f"{source}: tensor {key!r} has shape {saved[key]} in "
                                     f"the checkpoint but {shape} in this model; build the "
                                     "model with the same sizes as the run that saved it")
    rehearse_rule(shadow, config, meta.get("rule", {}), source)


def _check_dcp(ctl: GrowthController) -> None:
    """Refuse DCP folders where the backend's state cannot go through DCP (DeepSpeed)."""
    ctl.backend.check_config(ctl.config.replace(checkpoint_format=DCP))


def _check_optimizer_class(ctl: GrowthController, meta: Mapping[str, Any], source: str) -> None:
    """CheckpointError before anything changes when the registered optimizer is of another
    class than the saved state's."""
    recipe, saved = ctl._slot.recipe, meta.get("optimizer_class")
    if "optimizer" not in meta or recipe is None or ctl._slot.user_owned or saved is None:
        return
    if recipe.cls.__qualname__ != saved:
        raise CheckpointError(f"{source}: the optimizer state was saved from {saved}, but "
                              f"{recipe.cls.__qualname__} is registered now; register the "
                              "same optimizer class and arguments as the saved run")


def restore_dcp(ctl: GrowthController, path: Path, meta: dict[str, Any], shapes: Shapes,
                metadata: Any, checked: bool = False) -> None:
    """Structure, controller and rule state, then the shards (model, optimizer, best)."""
    source = str(path)
    _check_dcp(ctl)
    state = checked_state(meta["controller"], source)
    _check_optimizer_class(ctl, meta, source)
    shadow = None if checked else _weightless(ctl)
    if shadow is not None:
        check_fits(shadow, meta, shapes, source, ctl.config)
    ctl._unshard()
    fit_structure(ctl.model, meta["structure"], source)
    ctl.state = state
    ctl.state.num_dendrites = ctl._layer_dendrites()
    ctl.rule.load_state_dict(meta.get("rule", {}), ctl._layers())
    ctl._rebuild_after_change()  # re-shard / re-wrap, rebuild the optimizer
    best = _load_tensors(ctl, path, meta, shapes, metadata)
    ctl._best, ctl._writer.best_unsaved = best, False
    if ctl.scheduler is not None and meta.get("scheduler") is not None:
        ctl.scheduler.load_state_dict(meta["scheduler"])
    if ctl._writer.report is not None:
        ctl.state.history = ctl._writer.report.resume_history(
            ctl.state.history, ctl.state.epoch, path.parent / "metrics.csv")
    ctl._arm_probe()
    ctl._last_time = time.perf_counter()


def _load_tensors(ctl: GrowthController, path: Path, meta: Mapping[str, Any], shapes: Shapes,
                  metadata: Any) -> BestSnapshot | None:
    """The saved shards into the model (and optimizer); the best snapshot, read whole."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    source = str(path)
    opt = ctl.optimizer
    restore_opt = opt is not None and "optimizer" in meta and not ctl._slot.user_owned
    module = _state_module(ctl)
    # (a fresh optimizer gets its state entries from one zero step at lr 0; loaded over)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SHARDED_TENSOR)
        model_sd, optim_sd = get_state_dict(module, [opt] if restore_opt else [])
    target: dict[str, Any] = {"model": dict(model_sd)}
    if restore_opt:
        tensors, _ = _split_optimizer(optim_sd)
        own = {f"{fqn}.{key}" for fqn, entry in tensors.items() for key in entry}
        saved = set(shapes.get("optim", {}))
        if own != saved:
            diff = sorted(own ^ saved)[:4]
            raise CheckpointError(f"{source}: the optimizer state does not fit the optimizer "
                                  f"registered now (differs in {diff}); register the same "
                                  "optimizer class and arguments as the saved run")
        target["optim"] = tensors
    if "best" in shapes:
        target["best"] = {k: torch.empty(s, dtype=d) for k, (s, d) in shapes["best"].items()}
    load_dcp(path, target, metadata)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SHARDED_TENSOR)
        _set_state(module, opt if restore_opt else None, target, meta, source)
    if "best" not in target:
        return None
    return BestSnapshot(dict(meta["best_structure"]), target["best"])


def _set_state(module: nn.Module, opt: torch.optim.Optimizer | None, target: Mapping[str, Any],
               meta: Mapping[str, Any], source: str) -> None:
    """``set_state_dict`` with the loaded tensors (and the optimizer's JSON half)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    try:
        if opt is not None:
            set_state_dict(module, [opt], model_state_dict=target["model"],
                           optim_state_dict=_join_optimizer(target["optim"], meta["optimizer"]))
        else:
            set_model_state_dict(module, target["model"])
    except (ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"{source}: the saved state does not fit the model or the "
                              f"optimizer registered now ({exc}); build the same model and "
                              "register the same optimizer as the saved run") from exc


def from_dcp_checkpoint(cls: type[GrowthController], path: str | Path, model: nn.Module,
                        config: PerforaConfig | None, settings: dict[str, Any], *,
                        optimizer: type | None, optimizer_args: dict[str, Any] | None,
                        scheduler: type | None, scheduler_args: dict[str, Any] | None,
                        run_dir: str | Path | None) -> GrowthController:
    """A controller of class ``cls`` continuing the run saved in the DCP folder ``path``."""
    from ..parallel import backend_of

    path, meta, shapes, metadata = read_checkpoint(path)
    if config is None:
        config = PerforaConfig.from_dict({**meta["config"], **settings})
    elif settings:
        config = config.replace(**settings)
    backend = backend_of(model)
    checked = False
    if not backend.sharded:  # resized before the controller is built, as from a file
        shadow = backend.shadow(model)
        if shadow is not None:
            check_fits(shadow, meta, shapes, str(path), config)
            checked = True
        fit_structure(model, meta["structure"], str(path))
    ctl = cls(model, config, run_dir=run_dir if run_dir is not None else path.parent)
    if optimizer is not None:
        ctl.set_optimizer(optimizer, **(optimizer_args or {}))
    if scheduler is not None:
        ctl.set_scheduler(scheduler, **(scheduler_args or {}))
    restore_dcp(ctl, path, meta, shapes, metadata, checked=checked)
    return ctl


__all__ = ["DCP", "FILE", "dcp_state", "format_of", "from_dcp_checkpoint", "is_dcp_path",
           "newest_checkpoint", "read_checkpoint", "resolve_format", "restore_dcp",
           "save_dcp_checkpoint", "warn_single_process"]
