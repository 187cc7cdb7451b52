"""What FSDP1 and FSDP2 share: the re-shardable spec, full state, optimizer state by name.

``fully_shard`` cannot be applied twice to a module, does not broadcast rank 0's values,
and a parameter added to a sharded module is neither sharded nor reduced. So perfora keeps
an unsharded copy of the model as a structural template: to restructure it gathers the full
state on every rank into that copy, grows or rewinds the copy, broadcasts rank 0's values,
and shards it again with the same arguments.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..distributed.collectives import is_distributed
from ..errors import CheckpointError, ParallelError

FSDP2_KIND = "fsdp2"
FSDP1_KIND = "fsdp1"
_FSDP1_PREFIX = "_fsdp_wrapped_module."
_SPEC_ATTR = "_perfora_wrapper_spec"


def _loaded_fsdp_class(name: str) -> type | None:
    """``torch.distributed.fsdp.<name>``, or None when nothing has imported that package: no
    model can hold an FSDP module then, and importing it only to find that out costs time."""
    return getattr(sys.modules.get("torch.distributed.fsdp"), name, None)


def fsdp_classes() -> tuple[type, ...]:
    """FSDP2's ``FSDPModule`` and FSDP1's ``FullyShardedDataParallel``, as far as loaded."""
    return tuple(cls for cls in map(_loaded_fsdp_class, ("FSDPModule",
                                                         "FullyShardedDataParallel")) if cls)


def is_fsdp2(model: nn.Module) -> bool:
    """True when ``fully_shard`` was applied to ``model`` or one of its submodules."""
    kind = _loaded_fsdp_class("FSDPModule")
    return kind is not None and any(isinstance(m, kind) for m in model.modules())


def is_fsdp1(model: nn.Module) -> bool:
    """True when ``model`` is a ``FullyShardedDataParallel`` (FSDP1) root."""
    kind = _loaded_fsdp_class("FullyShardedDataParallel")
    return kind is not None and isinstance(model, kind)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of a sharded model, unsharded, on every rank (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_fsdp2(model) and not is_fsdp1(model):
        return dict(model.state_dict())
    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    return dict(get_model_state_dict(model, options=options))


def optimizer_param_names(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[str]:
    """Each optimizer parameter's name in ``model``, in state_dict order (index -> name)."""
    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise CheckpointError(f"the optimizer holds {len(missing)} parameter(s) that are not in "
                              "the model; under FSDP2 perfora saves optimizer state by "
                              "parameter name, so build the optimizer over model.parameters()")
    return [names[id(p)] for p in params]


def _full(value: Any) -> Any:
    """A DTensor gathered to a plain full tensor (a collective); anything else unchanged."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def gather_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module
                           ) -> tuple[dict[str, Any], list[str]]:
    """The optimizer's state_dict with full tensors, and its parameters' names (a collective).

    Every rank must call it: each sharded state tensor is all-gathered, in index and key
    order, so the collectives line up across ranks."""
    sd = optimizer.state_dict()
    names = optimizer_param_names(optimizer, model)
    state = {idx: {key: _full(entry[key]) for key in sorted(entry)}
             for idx, entry in sorted(sd["state"].items())}
    return {"state": state, "param_groups": sd["param_groups"]}, names


def chunk_for(full: torch.Tensor, mesh, placements) -> torch.Tensor:
    """This rank's part of ``full`` when placed on ``mesh`` as ``placements`` (FSDP2 cuts
    dim-0 chunks with ``torch.chunk``; ranks past the last chunk hold an empty slice)."""
    from torch.distributed.tensor import Replicate, Shard

    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ParallelError("this rank is not in the model's device mesh")
    local = full
    for mesh_dim, placement in enumerate(placements):
        if type(placement) is Shard:
            chunks = torch.chunk(local, mesh.size(mesh_dim), dim=placement.dim)
            index = coordinate[mesh_dim]
            local = chunks[index] if index < len(chunks) else local.narrow(placement.dim, 0, 0)
        elif not isinstance(placement, Replicate):
            raise ParallelError(f"perfora cannot restructure a parameter placed as "
                                f"{placements}; it supports FSDP2's Shard(0) and Replicate")
    return local


def local_shard(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``full``, placed like the DTensor ``param`` (FSDP2's dim-0 chunks).

    ``torch.chunk`` over the mesh size on each sharded dimension; ranks past the last chunk
    get an empty slice, as FSDP2 gives them. Checked against ``param``'s own local shape."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return full
    if tuple(full.shape) != tuple(param.shape):
        raise ValueError(f"an optimizer state tensor has shape {tuple(full.shape)} but "
                         f"its parameter {tuple(param.shape)}; under FSDP2 perfora restores "
                         "only per-element and scalar optimizer state")
    local = chunk_for(full, param.device_mesh, param.placements)
    own = param.to_local()
    if local.shape != own.shape:
        raise ValueError(f"this rank's optimizer state slice has shape "
                         f"{tuple(local.shape)} but its parameter shard "
                         f"{tuple(own.shape)}")
    local = local.to(device=own.device).clone()
    return DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape,
                              stride=param.stride(), run_check=False)


def _restore(value: Any, param: torch.Tensor) -> Any:
    """A saved state value for ``param``: scalars (Adam's ``step``) as saved, tensors sharded."""
    if not isinstance(value, torch.Tensor) or (value.dim() == 0 and param.dim() != 0):
        return value
    return local_shard(value, param)


def shard_optimizer_state(saved: dict[str, Any], names: list[str] | None,
                          optimizer: torch.optim.Optimizer, model: nn.Module
                          ) -> dict[str, Any]:
    """A state_dict for ``optimizer`` (over the sharded model) from a gathered one.

    Entries are matched by parameter name (``names``: saved index -> name; without it,
    by position), and every tensor that is not a scalar is cut to this rank's shard."""
    now = optimizer_param_names(optimizer, model)
    names = now if names is None else names
    params = [p for group in optimizer.param_groups for p in group["params"]]
    current = optimizer.state_dict()["param_groups"]
    if len(saved["param_groups"]) != len(current):
        raise ValueError(f"the checkpoint has {len(saved['param_groups'])} parameter "
                         f"group(s), the optimizer {len(current)}")
    for old, new in zip(saved["param_groups"], current):
        if {names[i] for i in old["params"]} != {now[i] for i in new["params"]}:
            raise ValueError("the saved optimizer state covers other parameters than the "
                             "optimizer registered now")
    by_name = {names[int(i)]: entry for i, entry in saved["state"].items()}
    state = {}
    for index, (name, param) in enumerate(zip(now, params)):
        if name in by_name:
            state[index] = {key: _restore(value, param) for key, value in by_name[name].items()}
    groups = [{**{k: v for k, v in old.items() if k != "params"}, "params": new["params"]}
              for old, new in zip(saved["param_groups"], current)]
    return {"state": state, "param_groups": groups}


def _local_device(model: nn.Module) -> torch.device:
    """The device of this rank's shards (DTensor parameters report their local device)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@dataclass
class ShardSpec:
    """How to shard again: the sharding arguments and an unsharded template (FSDP1 or FSDP2)."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    template: nn.Module | None = field(default=None, repr=False)

    kind = ""

    def sharded(self, model: nn.Module) -> bool:
        """True when ``model`` is sharded the way this spec shards."""
        raise NotImplementedError

    def _shard(self, module: nn.Module) -> nn.Module:
        """Shard ``module`` with the kept arguments; returns the module to train."""
        raise NotImplementedError

    def _place(self, module: nn.Module) -> None:
        """Move ``module`` where sharding expects it before the broadcast (FSDP1's device_id)."""

    def unshard(self, model: nn.Module) -> nn.Module:
        """An unsharded module holding ``model``'s full state (a collective on every rank)."""
        if not self.sharded(model):
            return model
        if self.template is None:
            raise ParallelError("perfora lost the unsharded copy of this FSDP2 model; shard "
                                "it with perfora.parallel.shard_fsdp2")
        state = full_state_dict(model)
        # the template is kept on the CPU or, structure only, on the meta device; the copy
        # goes where the shards live (NCCL can only broadcast device tensors)
        device = _local_device(model)
        plain = copy.deepcopy(self.template)
        if any(t.is_meta for t in [*plain.parameters(), *plain.buffers()]):
            plain = plain.to_empty(device=device)
            with torch.no_grad():  # buffers outside the state_dict (non-persistent) too
                buffers = dict(model.named_buffers())
                for name, b in plain.named_buffers():
                    if name in buffers:
                        b.copy_(buffers[name])
        else:
            plain = plain.to(device)
        plain.load_state_dict(state)
        flags = {n.replace(_FSDP1_PREFIX, ""): p.requires_grad
                 for n, p in model.named_parameters()}
        for name, p in plain.named_parameters():
            p.requires_grad_(flags.get(name, p.requires_grad))
        # train/eval as the live model (the template kept its modes from when it was taken):
        # a BatchNorm or Dropout in eval mode must stay so through a restructure
        modes = {n.replace(_FSDP1_PREFIX, ""): m.training for n, m in model.named_modules()}
        for name, module in plain.named_modules():
            module.training = modes.get(name, module.training)
        return plain

    def wrap(self, module: nn.Module, *, again: bool = False) -> nn.Module:
        """Broadcast rank 0's values into ``module`` and shard it (a collective). ``again``
        (a re-shard after a restructure): the parameters only, so that each rank keeps its
        own buffers (BatchNorm's running statistics, which FSDP leaves to each rank) and its
        outputs do not change."""
        if self.sharded(module):
            return module  # already sharded: requires_grad flips need no re-shard
        self._place(module)
        if is_distributed():
            with torch.no_grad():
                for t in [*module.parameters(), *([] if again else module.buffers())]:
                    dist.broadcast(t.data, src=0)
        self.template = self._keep_template(module)
        training = module.training
        wrapped = self._shard(module)
        wrapped.training = training  # FSDP1's new root starts in train mode: keep eval
        return self.adopt(wrapped)

    def _keep_template(self, module: nn.Module) -> nn.Module:
        """The unsharded copy kept for the next re-shard (a CPU copy of every value)."""
        return copy.deepcopy(module).cpu()

    def same_as_held_by(self, model: nn.Module, caller: str) -> bool:
        """True when perfora already sharded ``model`` this way (Lightning calls
        ``configure_model`` at every stage, so a second call must return the model as it
        is); a model sharded otherwise, or with other arguments, raises ParallelError."""
        held = getattr(model, _SPEC_ATTR, None)
        if not isinstance(held, ShardSpec) or held.kind != self.kind:
            return False
        mine, theirs = self._arguments(), held._arguments()
        if mine != theirs:
            differ = sorted(k for k in mine.keys() | theirs.keys()
                            if mine.get(k) != theirs.get(k))
            raise ParallelError(f"{caller} got a model it already sharded with other "
                                f"arguments ({', '.join(differ)}); give it the unsharded, "
                                "perforated model, or the same arguments as before")
        return True

    def _arguments(self) -> dict[str, Any]:
        """What a second call must repeat to be the same sharding."""
        return dict(self.kwargs)

    def adopt(self, wrapped: nn.Module) -> nn.Module:
        """Mark a sharded model as this spec's, so that perfora can re-shard it."""
        object.__setattr__(wrapped, _SPEC_ATTR, self)
        return wrapped
