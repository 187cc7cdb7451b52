"""Widen a ZeRO-3 model one layer pair at a time: no rank ever holds the whole model.

For each layer that gains neurons, perfora gathers that layer, the layers that read it and
the norms between them whole (``deepspeed.zero.GatheredParameters``), as plain copies
inside a structure-only copy of the model, widens them exactly as an unsharded model is
widened, and partitions the copies' parameters at once (DeepSpeed broadcasts rank 0's values
first); the copies then take the old modules' places, so the next pair reads what this one
widened. The engine is rebuilt afterwards over the new parameters.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

from torch import nn

from ..nn.consumers import LayerPlan
from ..nn.layers import dendritic_layers
from .shard_local import _LIVE_SETTINGS, _set_child
from .shard_local_widening import is_module, pair_paths
from .zero3 import _reference, local_device, meta_copy, whole_layer


class Zero3PairwiseWidening:
    """One neuron step on a ZeRO-3 module (changed in place), and its new template."""

    def __init__(self, module: nn.Module, template: nn.Module) -> None:
        self.module = module
        self.reference = _reference(module)
        self.device = local_device(module)
        self.template = copy.deepcopy(template)
        modes = {name: m.training for name, m in module.named_modules()}
        for name, sub in self.template.named_modules():  # train/eval as the live model
            sub.training = modes.get(name, sub.training)
        live = dendritic_layers(module)
        for path, layer in dendritic_layers(self.template).items():
            for attr in _LIVE_SETTINGS:  # set on the live layers after the template was taken
                if hasattr(live[path], attr):
                    setattr(layer, attr, copy.copy(getattr(live[path], attr)))

    @contextlib.contextmanager
    def scope(self, entry: LayerPlan) -> Iterator[nn.Module]:
        """The structure-only model with the modules of ``entry`` whole (a collective); on
        exit they are partitioned and take their places in the live module."""
        dtype = self.reference.ds_tensor.dtype
        for path in [p for p in pair_paths(entry) if is_module(self.template, p)]:
            plain = whole_layer(self.module.get_submodule(path),
                                self.template.get_submodule(path), self.device, dtype)
            _set_child(self.template, path, plain)
        yield self.template
        for path in [p for p in pair_paths(entry) if is_module(self.template, p)]:
            plain = self.template.get_submodule(path)
            _set_child(self.template, path, meta_copy(plain))
            params = list(plain.parameters())
            if params:
                self.reference.convert_to_zero_parameters(param_list=params)
            _set_child(self.module, path, plain)
