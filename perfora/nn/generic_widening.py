"""Widen and narrow the dendrite bank of a generic dendritic layer over a Linear or Hugging
Face ``Conv1D`` (GPT-2's layers): each parameter of the wrapped layer is stacked on a new
first axis, one entry per dendrite set, so a new neuron is one more slice along the layer's
own output axis (plus one), and a new input one more zero slice along its input axis.

Called by :mod:`perfora.nn.widening` and :mod:`perfora.nn.narrowing`; the base layer itself
is widened there, block by block, and the bank's calls (``torch.func.functional_call`` of
that same layer) then run block by block too, so the old neurons keep their bits.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import PerforationError
from .blocks import is_hf_conv1d
from .layers import DendriticLayer


def _dims(layer: DendriticLayer) -> tuple[int, int]:
    """(output dim, input dim) of the wrapped layer's weight (Conv1D's is [in, out])."""
    return (1, 0) if is_hf_conv1d(layer.source) else (0, 1)


def _check_names(layer: DendriticLayer) -> None:
    unknown = sorted(set(layer.bank_params) - {"weight", "bias"})
    if unknown or not (is_hf_conv1d(layer.source) or isinstance(layer.source, nn.Linear)):
        raise PerforationError(f"a generic dendritic layer over a {type(layer.source).__name__} "
                               f"(bank parameters {sorted(layer.bank_params)}) cannot change "
                               "width; only one over a Linear or Conv1D can")


def grow_generic_outputs(layer: DendriticLayer, rows: list[torch.Tensor]) -> None:
    """Each dendrite set gains the new neurons' incoming weights (``rows[i]``, in the wrapped
    weight's layout) and zero biases; call it with no gradient recorded."""
    _check_names(layer)
    od, _ = _dims(layer)
    bank = dict(layer.bank_params.items())
    new = {"weight": torch.cat([bank["weight"].detach(),
                                torch.stack(rows).to(bank["weight"])], od + 1)}
    if "bias" in bank:
        b = bank["bias"].detach()
        new["bias"] = torch.cat([b, b.new_zeros(b.shape[0], rows[0].shape[od])], 1)
    layer.bank_params = nn.ParameterDict(
        {key: layer._new_param(t, "bank") for key, t in new.items()})


def grow_generic_inputs(layer: DendriticLayer, extra: int) -> None:
    """Each dendrite set gains ``extra`` zero input columns; call it with no gradient recorded."""
    _check_names(layer)
    _, in_dim = _dims(layer)
    w = layer.bank_params["weight"].detach()
    shape = list(w.shape)
    shape[in_dim + 1] = extra
    layer.bank_params["weight"] = layer._new_param(torch.cat([w, w.new_zeros(shape)],
                                                             in_dim + 1), "bank")


def cut_generic_outputs(layer: DendriticLayer, keep: int) -> None:
    """Each dendrite set keeps its first ``keep`` neurons (a narrowing)."""
    _check_names(layer)
    od, _ = _dims(layer)
    dims = {"weight": od + 1, "bias": 1}
    layer.bank_params = nn.ParameterDict({
        key: layer._new_param(t.detach().narrow(dims[key], 0, keep).clone(), "bank")
        for key, t in layer.bank_params.items()})


def cut_generic_inputs(layer: DendriticLayer, keep: int) -> None:
    """Each dendrite set keeps its first ``keep`` input columns (a narrowing)."""
    _check_names(layer)
    _, in_dim = _dims(layer)
    w = layer.bank_params["weight"].detach()
    layer.bank_params["weight"] = layer._new_param(w.narrow(in_dim + 1, 0, keep).clone(),
                                                   "bank")
