"""FSDP2 (``fully_shard``): a spec perfora can shard again, and its backend.

Growth, the rewind to the best model and best-model snapshots are shard-local here (see
:mod:`perfora.parallel.shard_local`): no rank ever gathers the whole model for them, and
the template kept for re-sharding holds the structure only (on the meta device).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ParallelError
from ..nn.layers import dendritic_layers
from .base import LayerEdit, PairScope, Prepare, T
from .shard_local import (
    META,
    ShardLocalRebuild,
    edit_layers,
    rebuild_from,
    sharded_clones,
    whole_tensors,
)
from .shard_local_widening import PairwiseWidening
from .sharded import ShardedBackend
from .sharded_state import FSDP2_KIND, ShardSpec, is_fsdp2


def _fully_shard():
    from torch.distributed.fsdp import fully_shard

    return fully_shard


@dataclass
class FSDP2Spec(ShardSpec):
    """How to shard again: ``fully_shard`` arguments, per-layer units, an unsharded template."""

    per_layer: bool = True

    kind = FSDP2_KIND

    def _arguments(self) -> dict[str, Any]:
        return {**self.kwargs, "per_layer": self.per_layer}

    def sharded(self, model: nn.Module) -> bool:
        """True when ``fully_shard`` was applied to ``model`` or a submodule."""
        return is_fsdp2(model)

    def _keep_template(self, module: nn.Module) -> nn.Module:
        """The structure only, on the meta device: the values live in the shards."""
        return copy.deepcopy(module).to(META)

    def _shard(self, module: nn.Module) -> nn.Module:
        """Each dendritic layer its own unit (``per_layer``), then the whole model."""
        shard = _fully_shard()
        if self.per_layer:
            for layer in dendritic_layers(module).values():
                if layer is not module:
                    shard(layer, **self.kwargs)
        shard(module, **self.kwargs)
        return module


class FSDP2Backend(ShardedBackend):
    """FSDP2: shard-local restructures; optimizer state saved as full tensors by name."""

    name = FSDP2_KIND

    def _rebuild(self) -> ShardLocalRebuild:
        return ShardLocalRebuild(self.spec._shard)

    def _template(self) -> nn.Module:
        if self.spec.template is None:
            raise ParallelError("perfora lost the structure of this FSDP2 model; shard it "
                                "with perfora.shard_fsdp2")
        return self.spec.template

    def edit_layers(self, model: nn.Module, edit: LayerEdit) -> nn.Module:
        """Each layer gathered whole on its own, edited, cut back to shards (a collective)."""
        if not self.spec.sharded(model):
            return super().edit_layers(model, edit)
        _drop_gradients(model)
        new, self.spec.template = edit_layers(model, self._template(), self._rebuild(), edit)
        return self.spec.adopt(new)

    def widen(self, model: nn.Module, grow: Callable[[nn.Module, PairScope], T]
              ) -> tuple[nn.Module, T]:
        """One layer pair gathered whole at a time, widened, cut back to shards; then the
        model is sharded again from its structure (a collective)."""
        if not self.spec.sharded(model):
            return super().widen(model, grow)
        _drop_gradients(model)
        step = PairwiseWidening(model, self._template())
        result = grow(step.template, step.scope)
        new, self.spec.template = step.finish(self._rebuild())
        return self.spec.adopt(new), result

    def snapshot(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """This rank's shards, cloned (no gather)."""
        return sharded_clones(model)

    def whole(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Sharded snapshot values gathered whole (a collective on every rank)."""
        return whole_tensors(tensors)

    def restore(self, model: nn.Module, structure: Mapping[str, Mapping],
                tensors: Mapping[str, torch.Tensor], prepare: Prepare) -> nn.Module:
        """A new sharded model with the structure, filled from the snapshot's own shards
        (or from whole tensors, each cut to this rank's chunk): no gather."""
        if not self.spec.sharded(model):
            return super().restore(model, structure, tensors, prepare)
        _drop_gradients(model)
        new, self.spec.template = rebuild_from(model, self._template(), self._rebuild(),
                                               structure, tensors, prepare)
        return self.spec.adopt(new)


def _drop_gradients(model: nn.Module) -> None:
    """Free the old parameters' gradients before building the new model: the new one
    trains with a new optimizer, and the memory is needed for its shards."""
    for p in model.parameters():
        p.grad = None


def shard_fsdp2(model: nn.Module, *, per_layer: bool = True, **fully_shard_kwargs: Any
                ) -> nn.Module:
    """``fully_shard`` a perforated model so that perfora can re-shard it after growth.

    Every dendritic layer becomes its own FSDP unit (``per_layer``), then the whole model;
    ``fully_shard_kwargs`` (``mesh=``, ``reshard_after_forward=``, ...) are kept and used
    again at every restructure. Rank 0's values are broadcast first. Call it on every rank,
    after :func:`perfora.perforate` and before creating the controller. A model it already
    sharded with the same arguments comes back as it is, as Lightning's ``configure_model``
    needs (it runs again for ``trainer.test``/``validate``/``predict`` after ``fit``).
    """
    spec = FSDP2Spec(dict(fully_shard_kwargs), per_layer=per_layer)
    if spec.same_as_held_by(model, "shard_fsdp2"):
        return model  # configure_model again (Lightning's test/validate/predict after fit)
    if is_fsdp2(model):
        raise ParallelError("shard_fsdp2 got a model that is already sharded with "
                            "fully_shard; give it the unsharded, perforated model")
    if not dendritic_layers(model):
        raise ParallelError("shard_fsdp2 needs a perforated model: call "
                            "perfora.perforate(model) first")
    return spec.wrap(model)
