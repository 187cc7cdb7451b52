"""The modules perforate refuses at selection time, with the way in for each: dendrites
could never run on them (no parameters, lazy or integer ones, a hidden state, a tuple output,
batch-norm statistics shared by the dendrites' copies, a weight computed by a
parametrization)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..errors import PerforationError


def refuse_unsupported(path: str, module: nn.Module) -> None:
    """Refuse, at selection time, modules whose dendrites could never run."""
    if not any(True for _ in module.parameters()):
        raise PerforationError(f"cannot perforate {path!r} ({type(module).__name__}): "
                               "it has no parameters to copy into dendrites")
    _refuse_unfit_parameters(path, module)
    if parametrized_inside(module):
        raise PerforationError(f"cannot perforate {path!r} ({type(module).__name__}): "
                               f"{PARAMETRIZED}. Remove it first (torch.nn.utils.parametrize."
                               "remove_parametrizations, or remove_weight_norm for the old "
                               "style), or leave the layer out")
    if isinstance(module, RECURRENT):
        raise recurrent_error(path, module)
    _refuse_running_statistics(path, module)
    if isinstance(module, nn.MultiheadAttention):
        raise PerforationError(
            f"cannot perforate {path!r} ({type(module).__name__}) as one layer: it returns "
            "(output, weights). Grow its output projection instead: "
            f"paths=[{path + '.out_proj'!r}]")


RECURRENT = (nn.RNNBase, nn.RNNCellBase)
PARAMETRIZED = ("its weight is computed by a parametrization (weight_norm, spectral_norm, "
                "torch.nn.utils.parametrize), and a dendrite set copies a layer's own "
                "parameters, which here are the parametrization's inputs")


def has_parametrization(module: nn.Module) -> bool:
    """True when one of the module's own weights is computed by a parametrization
    (``weight_norm``, ``spectral_norm``, ``torch.nn.utils.parametrize``; old or new style)."""
    return parametrize.is_parametrized(module) or any(
        type(hook).__name__ in ("WeightNorm", "SpectralNorm")
        for hook in module._forward_pre_hooks.values())


def parametrized_inside(module: nn.Module) -> bool:
    """True when the module or any module inside it has a parametrized weight."""
    return any(has_parametrization(m) for m in module.modules())


def _refuse_running_statistics(path: str, module: nn.Module) -> None:
    """A block holding a batch norm: its dendrites, copies of the block, would update the
    block's running statistics (and cannot under vmap), so it is refused with the way in."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return  # a norm alone is refused elsewhere, as a layer with no neuron axis to grow
    inner = next(((name, m) for name, m in module.named_modules()
                  if isinstance(m, nn.modules.batchnorm._BatchNorm)), None)
    if inner is not None:
        where = f"{path}.{inner[0]}"
        raise PerforationError(
            f"cannot perforate {path!r} ({type(module).__name__}) as one layer: it holds "
            f"{type(inner[1]).__name__} {where!r}, whose running statistics the dendrites' "
            "copies of the block would share. Perforate the Linear/Conv layers inside it "
            "instead (the default types select them), and pair each conv with its norm: "
            f"groups=[(<conv path>, {where!r})]")


def recurrent_error(path: str, module: nn.Module, tail: str = "") -> PerforationError:
    """Why a recurrent layer (``path``; "" for the model itself) cannot be perforated."""
    where = repr(path) if path else "the model"
    return PerforationError(
        f"cannot perforate {where} ({type(module).__name__}): recurrent layers take and "
        "return a hidden state besides their output, which dendrites do not support. "
        "Perforate the Linear layers that read its output instead (the default types "
        f"select them and leave recurrent layers alone){tail}")


def _refuse_unfit_parameters(path: str, module: nn.Module) -> None:
    """Refuse parameters growth cannot copy: uninitialised (lazy) or not floating point."""
    for name, p in module.named_parameters():
        if isinstance(p, nn.parameter.UninitializedParameter):
            raise PerforationError(
                f"cannot perforate {path!r} ({type(module).__name__}): its parameter "
                f"{name!r} is not initialised yet (a lazy module), so its shape is unknown. "
                "Run one forward pass of the model first, then perforate it; or leave the "
                f"layer out: perforate(model, exclude=[{path!r}])")
        if not p.is_floating_point():
            raise PerforationError(
                f"cannot perforate {path!r} ({type(module).__name__}): its parameter "
                f"{name!r} is {p.dtype}, and dendrites are trained floating-point copies. "
                f"Leave the layer out: perforate(model, exclude=[{path!r}]), or dequantize "
                "it to a float dtype first")


def not_one_tensor(module: nn.Module) -> str | None:
    """Why a Linear subclass with a forward of its own cannot be wrapped, or None: called on
    one row of zeros, it returns something other than one tensor (a Mixture-of-Experts router
    that subclasses Linear and returns scores with its logits: Llama 4's, PhiMoE's). Plain
    Linears, convolutions and layers that cannot be called here (weights on the meta device,
    quantized kernels) are not judged. The random state is restored after the call, and the
    module's hooks do not run."""
    if not isinstance(module, nn.Linear) or type(module).forward is nn.Linear.forward:
        return None
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.is_meta or weight.dim() != 2:
        return None
    devices = [weight.device] if weight.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            out = module.forward(torch.zeros(1, weight.shape[1], dtype=weight.dtype,
                                             device=weight.device))  # no hooks run
    except Exception:  # noqa: BLE001 - a layer that cannot be probed is wrapped as before
        return None
    if isinstance(out, torch.Tensor):
        return None
    return (f"{type(module).__name__} subclasses Linear but returns a "
            f"{type(out).__name__}, not one tensor (a Mixture-of-Experts router?), so no "
            "dendrite can add to its output")

