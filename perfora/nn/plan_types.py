"""The plan of a widening: which layers can gain neurons, what changes with each, and the
module kinds the search knows (read by :mod:`perfora.nn.consumers` and
:mod:`perfora.nn.known_blocks`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from .blocks import CONV_TYPES, TRANSPOSED_CONVS, Blockwise, is_hf_conv1d
from .layers import DendriticLayer
from .refusals import has_parametrization

ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.Tanh,
               nn.Sigmoid, nn.SiLU, nn.Mish, nn.Softplus, nn.Hardtanh, nn.Hardswish,
               nn.Hardsigmoid, nn.Tanhshrink, nn.Softsign, nn.Identity, Blockwise)
DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
POOLING = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
           nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
           nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)
# computed element by element the same way whatever the tensor's width (measured: relu's
# outputs never differ in the last bit, sigmoid's or silu's do): a widening leaves them alone
WIDTH_EXACT = (nn.ReLU, nn.Hardtanh, nn.Identity)  # Hardtanh includes ReLU6
JOINT_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.LocalResponseNorm)
ATTENTION_NAMES = {"q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "query", "key",
                    "value", "c_attn", "qkv", "in_proj", "q", "k", "v"}
RESIDUAL = "its output is added into the residual stream (d_model), which many layers read"


def is_hf_activation(module: object) -> bool:
    """A Hugging Face activation module (``transformers.activations``: GELU variants, SiLU,
    ReLU squared, ...) without parameters: applied element by element, like torch's."""
    return isinstance(module, nn.Module) \
        and type(module).__module__ == "transformers.activations" \
        and not any(True for _ in module.parameters()) \
        and not any(True for _ in module.buffers())


def is_elementwise(module: object) -> bool:
    """A module applied element by element, which a widening applies block by block (or
    leaves as it is where it is exact on any width)."""
    return isinstance(module, ELEMENTWISE) or is_hf_activation(module)

def is_width_exact(module: object) -> bool:
    """True for a module a widening leaves as it is, exact on any width: relu-like
    activations, identity, and a drop path (stochastic depth), which scales each sample by one
    random number drawn the same way whatever the width."""
    if isinstance(module, WIDTH_EXACT):
        return True
    return isinstance(module, nn.Module) and type(module).__name__.endswith("DropPath") \
        and not any(True for _ in module.parameters()) \
        and not any(True for _ in module.buffers())


@dataclass
class LayerPlan:
    """One layer: can it gain neurons, and if so what changes with it.

    ``consumers``: (path, repeat) of each layer that gains ``k * repeat`` zero input columns
    (repeat is the spatial size after a Flatten, else 1); ``through``: (path, axis) of each
    BatchNorm (gains channels) or stateless module/function (applied block by block) between
    them; ``partners``: layers widened together with this one (Llama's gate and up);
    ``chunks``: the number of equal parts the block cuts the layer's output into (a fused gate
    and up projection: 2), each neuron a row in every part (:mod:`perfora.nn.chunked`)."""

    path: str
    widenable: bool
    reason: str | None = None
    consumers: list[tuple[str, int]] = field(default_factory=list)
    through: list[tuple[str, int]] = field(default_factory=list)
    partners: list[str] = field(default_factory=list)
    found_by: str = ""
    chunks: int = 1


@dataclass
class WideningPlan:
    """Per layer (by path), whether it can gain neurons: its consumers, or why not."""

    layers: dict[str, LayerPlan] = field(default_factory=dict)

    @property
    def widenable(self) -> list[str]:
        return [p for p, e in self.layers.items() if e.widenable]

    @property
    def refused(self) -> dict[str, str]:
        return {p: e.reason or "" for p, e in self.layers.items() if not e.widenable}

    def __str__(self) -> str:
        lines = [f"{len(self.widenable)} of {len(self.layers)} layer(s) can gain neurons:"]
        for path, e in self.layers.items():
            if e.widenable:
                reads = ", ".join(p if r == 1 else f"{p} (x{r})" for p, r in e.consumers)
                extra = f" with {', '.join(e.partners)}" if e.partners else ""
                extra += f" ({e.chunks} rows per neuron)" if e.chunks > 1 else ""
                lines.append(f"  {path}{extra} -> {reads}  [{e.found_by}]")
            else:
                lines.append(f"  {path}: refused: {e.reason}")
        return "\n".join(lines)


def is_producer(module: nn.Module) -> bool:
    """A layer that can gain output neurons: Linear, Conv (groups=1), HF Conv1D, or a
    dendritic layer over one of them."""
    if isinstance(module, DendriticLayer):
        if module.kind == "generic":  # e.g. GPT-2's Conv1D, with its sets (generic_widening)
            return isinstance(module.source, nn.Linear) or is_hf_conv1d(module.source)
        return module.kind in ("linear", "conv") and module._groups() == 1
    if isinstance(module, CONV_TYPES):
        return module.groups == 1
    return isinstance(module, nn.Linear) or is_hf_conv1d(module)


def is_consumer(module: nn.Module) -> bool:
    """A layer that can gain input columns for a widened layer's new neurons: a producer, or
    a ConvTranspose (groups=1), which reads them but does not gain neurons itself."""
    return is_producer(module) or (isinstance(module, TRANSPOSED_CONVS) and module.groups == 1)


def is_grouped_conv(module: nn.Module) -> bool:
    """A Conv with groups > 1, plain or wrapped as a dendritic layer."""
    core = module.source if isinstance(module, DendriticLayer) else module
    return isinstance(core, CONV_TYPES) and core.groups != 1


def grouped_reason(path: str, module: nn.Module, width: int, axis: int,
                    flat: bool) -> str | None:
    """None where a widening passes through the grouped conv at ``path``: a depthwise conv
    (MobileNet's, EfficientNet's) with one output per channel over exactly the producer's
    channels, which gains k channels of its own (random filters: the reader after it gains
    zero columns); else why not."""
    core = module.source if isinstance(module, DendriticLayer) else module
    g, n_in, n_out = core.groups, core.in_channels, core.out_channels
    if axis == -1 or flat:
        return (f"its output goes to {path}, a grouped convolution, on an axis other than "
                "its channels")
    if not g == n_in == n_out:
        return (f"its output goes to {path}, a grouped convolution (groups={g}, {n_in} in, "
                f"{n_out} out): a widening passes only through a depthwise conv with one "
                "output per input channel")
    if n_in != width:
        return f"{path} reads {n_in} channels, not its {width}"
    return None


def parametrized(module: nn.Module) -> bool:
    """True when a layer's weight is computed by a parametrization (``weight_norm``,
    ``spectral_norm``, ``torch.nn.utils.parametrize``; old or new style)."""
    return has_parametrization(module.source if isinstance(module, DendriticLayer) else module)


def width_of(module: nn.Module, side: str) -> int:
    """A layer's output ('out') or input ('in') width (HF Conv1D's weight is [in, out], a
    ConvTranspose's [in, out, *kernel])."""
    core = module.source if isinstance(module, DendriticLayer) else module
    w = core.weight
    if is_hf_conv1d(core):
        return int(w.shape[1] if side == "out" else w.shape[0])
    if isinstance(core, TRANSPOSED_CONVS):  # [in, out / groups, *kernel]
        return int(w.shape[1] * core.groups if side == "out" else w.shape[0])
    return int(w.shape[0] if side == "out" else w.shape[1])


def axis_of(module: nn.Module) -> int:
    """The axis of a layer's outputs that holds its neurons (a conv's channels, from the end)."""
    core = module.source if isinstance(module, DendriticLayer) else module
    # a conv's channel axis counted from the end: the same for batched and unbatched inputs
    return 1 - core.weight.dim() if isinstance(core, CONV_TYPES) else -1


def refuse(path: str, reason: str, found_by: str) -> LayerPlan:
    """A plan entry that says why ``path`` cannot gain neurons."""
    return LayerPlan(path, False, reason, found_by=found_by)
