"""The feed-forward pairs of known Transformer blocks (torch's; BERT, DistilBERT, ALBERT; GPT-2,
GPT-Neo, GPTBigCode, Llama, T5; the fused gate-and-up projections of Phi-3, GLM and ModernBERT;
ViT and CLIP MLPs; GPT-NeoX/Falcon/BLOOM/GPT-J MLPs; OPT and BART-family layers; wav2vec
2.0-family feed-forwards; SegFormer's Mix-FFN) and of ConvNeXt blocks, LeViT's MLPs and
PoolFormer's channel MLPs (:mod:`perfora.nn.vision_mlps`): which hidden layer gains
neurons and what reads it, and refusals for the rest of those blocks (the residual width,
attention projections). Only the hidden width grows. Also the inverted residual blocks of
transformers' MobileNetV2, MobileViT and EfficientNet (:mod:`perfora.nn.inverted_residual`),
whose expansion widens through the depthwise conv."""

from __future__ import annotations

from torch import nn

from .block_check import checked_block
from .blocks import is_hf_conv1d
from .inverted_residual import efficientnet_block, inverted_residual, mobilenet_v1_layers
from .layers import DendriticLayer
from .plan_types import ATTENTION_NAMES, RESIDUAL, LayerPlan, is_producer, refuse, width_of
from .vision_mlps import vision_mlp


def known_blocks(model: nn.Module) -> list[LayerPlan]:
    """The Transformer feed-forward pairs, and refusals for the rest of those blocks."""
    out: list[LayerPlan] = _hf_heads(model) + _patch_embeddings(model)
    for path, m in model.named_modules():
        pre, kind = (f"{path}." if path else ""), type(m).__name__

        def has(*names: str, _m=m) -> bool:
            return all(_has_path(_m, n) for n in names)

        convs = inverted_residual(m, pre)
        convs = efficientnet_block(m, pre) if convs is None else convs
        convs = vision_mlp(m, pre) if convs is None else convs  # LeViT, PoolFormer
        convs = mobilenet_v1_layers(m, pre) if convs is None else convs
        if convs is not None:
            out.extend(convs)
        elif isinstance(m, nn.TransformerEncoderLayer | nn.TransformerDecoderLayer):
            out.append(LayerPlan(pre + "linear1", True, consumers=[(pre + "linear2", 1)],
                                 through=[(pre + "activation", -1), (pre + "dropout", -1)],
                                 found_by="nn.Transformer block"))
            out.append(refuse(pre + "linear2", RESIDUAL, "nn.Transformer block"))
        elif kind.endswith("Layer") and has("dwconv", "pwconv1", "act", "pwconv2"):
            # ConvNeXt: dwconv -> norm -> pwconv1 -> act -> pwconv2 (Linears, channels last)
            out.append(checked_block(m, pre, LayerPlan(
                pre + "pwconv1", True, consumers=[(pre + "pwconv2", 1)],
                through=[(pre + "act", -1)], found_by="ConvNeXt block"),
                upstream=("dwconv", "layernorm", "drop_path")))
            out.append(refuse(pre + "pwconv2", RESIDUAL, "ConvNeXt block"))
        elif has("lin1", "lin2", "activation"):  # DistilBERT: lin1 -> activation -> lin2
            out.append(checked_block(m, pre, LayerPlan(
                pre + "lin1", True, consumers=[(pre + "lin2", 1)],
                through=[(pre + "activation", -1)], found_by="DistilBERT feed-forward")))
            out.append(refuse(pre + "lin2", RESIDUAL, "DistilBERT feed-forward"))
        elif has("ffn", "ffn_output", "activation"):  # ALBERT: its layer runs at every depth
            out.append(checked_block(m, pre, LayerPlan(
                pre + "ffn", True, consumers=[(pre + "ffn_output", 1)],
                through=[(pre + "activation", -1)], found_by="ALBERT layer"),
                upstream=("attention", "full_layer_layer_norm")))
            out.append(refuse(pre + "ffn_output", RESIDUAL + " (then LayerNorm)", "ALBERT layer"))
        elif has("intermediate_dense", "intermediate_act_fn", "output_dense"):
            # wav2vec 2.0, HuBERT, WavLM, Data2VecAudio: dense -> act -> dropout -> dense
            out.append(checked_block(m, pre, LayerPlan(
                pre + "intermediate_dense", True, consumers=[(pre + "output_dense", 1)],
                through=_present(m, pre, "intermediate_act_fn", "intermediate_dropout"),
                found_by="wav2vec 2.0 feed-forward")))
            out.append(refuse(pre + "output_dense", RESIDUAL, "wav2vec 2.0 feed-forward"))
        elif has("intermediate.dense", "intermediate.intermediate_act_fn", "output.dense"):
            out.append(LayerPlan(pre + "intermediate.dense", True,
                                 consumers=[(pre + "output.dense", 1)],
                                 through=[(pre + "intermediate.intermediate_act_fn", -1)],
                                 found_by="BERT block"))
            out.append(refuse(pre + "output.dense", RESIDUAL + " (then LayerNorm)",
                               "BERT block"))
            if _has_path(m, "attention.output.dense"):  # the attention's output projection
                out.append(refuse(pre + "attention.output.dense",
                                  RESIDUAL + " (then LayerNorm)", "BERT block"))
        elif has("c_fc", "c_proj", "act") and _dense_core(m.c_fc):
            # GPT-2 (HF Conv1D); GPT-Neo and GPTBigCode/StarCoder (nn.Linear)
            out.append(checked_block(m, pre, LayerPlan(
                pre + "c_fc", True, consumers=[(pre + "c_proj", 1)],
                through=[(pre + "act", -1)], found_by="GPT-2 MLP")))
            out.append(refuse(pre + "c_proj", RESIDUAL, "GPT-2 MLP"))
        elif type(m).__name__.endswith("DenseGatedActDense") and \
                has("wi_0", "wi_1", "wo", "act"):  # T5 v1.1, mT5, UMT5: act(wi_0) * wi_1
            for name, other in (("wi_0", "wi_1"), ("wi_1", "wi_0")):
                out.append(checked_block(m, pre, LayerPlan(
                    pre + name, True, consumers=[(pre + "wo", 1)],
                    through=_present(m, pre, "act", "dropout"), partners=[pre + other],
                    found_by="T5 feed-forward")))
            out.append(refuse(pre + "wo", RESIDUAL, "T5 feed-forward"))
        elif type(m).__name__.endswith("DenseActDense") and has("wi", "wo", "act"):  # T5
            out.append(checked_block(m, pre, LayerPlan(
                pre + "wi", True, consumers=[(pre + "wo", 1)],
                through=_present(m, pre, "act", "dropout"), found_by="T5 feed-forward")))
            out.append(refuse(pre + "wo", RESIDUAL, "T5 feed-forward"))
        elif has("fc1", "dwconv.dwconv", "activation_fn", "fc2"):  # SegFormer's Mix-FFN
            out.append(_mix_ffn_pair(m, pre))
            out.append(refuse(pre + "fc2", RESIDUAL, _MIX_FFN))
        elif has("dense1", "dwconv.dwconv", "intermediate_act_fn", "dense2"):  # PVTv2
            out.append(_mix_ffn_pair(m, pre, _PVT_V2_FFN))
            out.append(refuse(pre + "dense2", RESIDUAL, _PVT_V2_FFN))
        elif type(m).__name__.endswith("MLP") and has("fc1", "fc2", "activation_fn") \
                and not has("gate_proj"):  # ViT (transformers 5), CLIP, SigLIP: fc1 -> act -> fc2
            out.append(checked_block(m, pre, LayerPlan(
                pre + "fc1", True, consumers=[(pre + "fc2", 1)],
                through=[(pre + "activation_fn", -1)], found_by="ViT/CLIP MLP")))
            out.append(refuse(pre + "fc2", RESIDUAL, "ViT/CLIP MLP"))
        elif (names := _plain_mlp_names(m)) is not None:  # GPT-NeoX, Falcon, GPT-J, MPT MLPs
            hidden, reader, act = names
            out.append(checked_block(m, pre, LayerPlan(
                pre + hidden, True, consumers=[(pre + reader, 1)],
                through=_present(m, pre, act, "dropout"), found_by=_PLAIN_MLP)))
            out.append(refuse(pre + reader, RESIDUAL, _PLAIN_MLP))
        elif _is_bart_like_layer(m):  # OPT, BART, mBART, Marian, Pegasus, Whisper layers
            out.append(_bart_like_pair(m, pre))
            out.append(refuse(pre + "fc2", RESIDUAL, "BART/OPT layer"))
        elif has("gate_proj", "up_proj", "down_proj") and \
                (act := _first_of(m, "act_fn", "activation_fn")) is not None:
            for name, other in (("gate_proj", "up_proj"), ("up_proj", "gate_proj")):
                out.append(checked_block(m, pre, LayerPlan(  # Llama 4 names it activation_fn
                    pre + name, True, consumers=[(pre + "down_proj", 1)],
                    through=[(pre + act, -1)], partners=[pre + other],
                    found_by="Llama MLP")))
            out.append(refuse(pre + "down_proj", RESIDUAL, "Llama MLP"))
        elif (fused := _fused_gated_pair(m)) is not None:  # Phi-3, GLM, ModernBERT
            out.append(checked_block(m, pre, LayerPlan(
                pre + fused[0], True, consumers=[(pre + fused[1], 1)],
                through=_present(m, pre, "activation_fn", "act", "activation", "drop"), chunks=2,
                found_by="fused gated MLP")))
            out.append(refuse(pre + fused[1], RESIDUAL, "fused gated MLP"))
        elif (residual := _resnet_residual_writers(m, pre)) is not None:  # HF ResNet
            out.extend(refuse(path, _CNN_RESIDUAL, "ResNet residual") for path in residual)
        else:
            for name, child in m.named_children():
                attention = "attention" in type(m).__name__.lower()
                if (name in ATTENTION_NAMES or attention) and is_producer(child) or \
                        isinstance(m, nn.MultiheadAttention) and name == "out_proj":
                    out.append(refuse(pre + name, "an attention projection: its outputs are "
                                       "split into heads or added to the residual stream",
                                       "attention"))
    return out


def _dense_core(layer: nn.Module) -> bool:
    """A Linear or Hugging Face Conv1D, plain or wrapped as a dendritic layer."""
    core = layer.source if isinstance(layer, DendriticLayer) else layer
    return isinstance(core, nn.Linear) or is_hf_conv1d(core)


def _present(block: nn.Module, pre: str, *names: str) -> list[tuple[str, int]]:
    """(path, feature axis -1) for each of ``names`` the block has: the modules between a
    feed-forward pair's layers, each applied block by block once widened."""
    return [(pre + name, -1) for name in names if hasattr(block, name)]


def _first_of(block: nn.Module, *names: str) -> str | None:
    """The first of ``names`` the block has as an attribute."""
    return next((name for name in names if hasattr(block, name)), None)


def _has_path(module: nn.Module, dotted: str) -> bool:
    for name in dotted.split("."):
        if not hasattr(module, name):
            return False
        module = getattr(module, name)
    return True


_PLAIN_MLP = "GPT-NeoX/GPT-J/MPT MLP"
_PLAIN_MLPS = (("dense_h_to_4h", "dense_4h_to_h"), ("fc_in", "fc_out"), ("up_proj", "down_proj"))
_ACTIVATIONS = ("act", "activation", "activation_fn", "act_fn", "gelu_impl")
_BART_LAYER_STATE = {"self_attn", "encoder_attn", "self_attn_layer_norm",
                     "encoder_attn_layer_norm", "final_layer_norm"}


def _plain_mlp_names(block: nn.Module) -> tuple[str, str, str] | None:
    """(hidden layer, reader, activation) of an MLP named as GPT-NeoX's, Falcon's
    (``dense_h_to_4h`` -> ``act`` -> ``dense_4h_to_h``), GPT-J's (``fc_in``/``fc_out``) or
    MPT's and Nemotron's (``up_proj``/``down_proj``, without Llama's ``gate_proj``)."""
    for hidden, reader in _PLAIN_MLPS:
        if hasattr(block, hidden) and hasattr(block, reader) and not hasattr(block, "gate_proj"):
            act = next((a for a in _ACTIVATIONS if isinstance(getattr(block, a, None),
                                                              nn.Module)
                        and not any(True for _ in getattr(block, a).parameters())), None)
            if act is not None:
                return hidden, reader, act
    return None


def _is_bart_like_layer(block: nn.Module) -> bool:
    """An encoder/decoder layer of the BART family (and OPT's): ``fc1`` -> ``activation_fn``
    -> dropout -> ``fc2`` in the layer itself, beside its attention and norms."""
    name = type(block).__name__
    return name.endswith(("EncoderLayer", "DecoderLayer")) and all(
        hasattr(block, a) for a in ("fc1", "fc2", "activation_fn", "self_attn"))


def _bart_like_pair(block: nn.Module, pre: str) -> LayerPlan:
    """The ``fc1`` -> ``fc2`` pair of such a layer. The layer does not trace with torch.fx,
    so it is checked by its parts: the widths agree and it holds nothing with state but the
    two layers, attention and norms."""
    by = "BART/OPT layer"
    gives, reads = width_of(block.fc1, "out"), width_of(block.fc2, "in")
    if gives != reads:
        return refuse(pre + "fc1", f"{pre}fc1 gives {gives} outputs and {pre}fc2 reads "
                                   f"{reads}; pass pairs= if its readers are known", by)
    extra = _other_state(block, pre, {"fc1", "fc2", "activation_fn", *_BART_LAYER_STATE}, by)
    return extra or LayerPlan(pre + "fc1", True, consumers=[(pre + "fc2", 1)],
                              through=[(pre + "activation_fn", -1)], found_by=by)


def _other_state(block: nn.Module, pre: str, roles: set[str], by: str,
                 hidden: str = "fc1") -> LayerPlan | None:
    """The refusal of ``hidden`` when a child of the block other than ``roles`` holds
    parameters or buffers (a pattern checked by its parts cannot say what such a child
    does)."""
    for name, child in block.named_children():
        if name not in roles and (any(True for _ in child.parameters())
                                  or any(True for _ in child.buffers())):
            return refuse(pre + hidden, f"the block also holds {pre}{name} "
                                       f"({type(child).__name__}), which the {by} pattern does "
                                       "not have; pass pairs= if its readers are known", by)
    return None


def _fused_gated_pair(block: nn.Module) -> tuple[str, str] | None:
    """(fused projection, reader) of a gated MLP whose gate and up projections are one layer,
    chunked in halves in its forward (Phi-3's and GLM's ``gate_up_proj``, ModernBERT's
    ``Wi``, Granite 4's shared expert's ``input_linear``): the layer gives twice the reader's
    inputs."""
    for fused, reader in (("gate_up_proj", "down_proj"), ("Wi", "Wo"),
                          ("input_linear", "output_linear")):
        layers = getattr(block, fused, None), getattr(block, reader, None)
        if all(layer is not None and is_producer(layer) for layer in layers) and \
                width_of(layers[0], "out") == 2 * width_of(layers[1], "in"):
            return fused, reader
    return None


_MIX_FFN = "SegFormer Mix-FFN"
_PVT_V2_FFN = "PVTv2 feed-forward"
_MIX_FFNS = {_MIX_FFN: ("fc1", "activation_fn", "fc2", ()),
             _PVT_V2_FFN: ("dense1", "intermediate_act_fn", "dense2", ("relu",))}
"""Per pattern: the hidden layer, the activation, the reader, and stateless modules between
the hidden layer and the depthwise conv."""


def _mix_ffn_pair(block: nn.Module, pre: str, by: str = _MIX_FFN) -> LayerPlan:
    """SegFormer's ``fc1`` -> depthwise conv over the image (``dwconv.dwconv``) ->
    ``activation_fn`` -> dropout -> ``fc2``, or PVTv2's ``dense1`` -> ``relu`` (an identity
    unless its attention is linear) -> ``dwconv.dwconv`` -> ``intermediate_act_fn`` -> dropout
    -> ``dense2``. Its forward takes the image size, so it is checked by its parts: the widths
    agree, the conv is depthwise, and nothing else holds state. The dropout, also used after
    the reader, stays as it is (exact in eval mode)."""
    hidden, act, reader, before = _MIX_FFNS[by]
    gives, reads = width_of(getattr(block, hidden), "out"), width_of(getattr(block, reader), "in")
    conv = block.dwconv.dwconv
    core = conv.source if isinstance(conv, DendriticLayer) else conv
    depthwise = isinstance(core, nn.Conv2d) and core.groups == core.in_channels == \
        core.out_channels == gives
    if gives != reads or not depthwise:
        return refuse(pre + hidden, f"{pre}{hidden} gives {gives} outputs, {pre}{reader} reads "
                                    f"{reads} and {pre}dwconv.dwconv is "
                                    f"{'' if depthwise else 'not '}a depthwise conv of that "
                                    "width; pass pairs= if its readers are known", by)
    extra = _other_state(block, pre, {hidden, "dwconv", act, reader}, by, hidden)
    return extra or LayerPlan(pre + hidden, True, consumers=[(pre + reader, 1)],
                              through=[*_present(block, pre, *before),
                                       (pre + "dwconv.dwconv", 1), (pre + act, -1)],
                              found_by=by)


_CNN_RESIDUAL = ("its output is added into the residual stream of the ResNet stages, which "
                 "many layers read: no list of readers can widen it")


def _resnet_residual_writers(block: nn.Module, pre: str) -> list[str] | None:
    """The convolutions whose outputs a transformers ResNet adds into its residual stream:
    a layer's last ``ConvLayer`` and its projection shortcut, and the stem (``embedder``)
    where the first layer's shortcut is the identity; None for other modules."""
    name = type(block).__name__
    if _has_path(block, "embedder.embedder.convolution") and \
            _has_path(block, "encoder.stages.0.layers.0.shortcut"):  # ResNetModel
        first = block.get_submodule("encoder.stages.0.layers.0.shortcut")
        return [] if hasattr(first, "convolution") else [pre + "embedder.embedder.convolution"]
    steps = getattr(block, "layer", None)
    if not (name.endswith("Layer") and hasattr(block, "shortcut")
            and isinstance(steps, nn.Sequential) and len(steps)
            and _has_path(steps[-1], "convolution")):
        return None
    writers = [f"{pre}layer.{len(steps) - 1}.convolution"]
    if _has_path(block, "shortcut.convolution"):
        writers.append(pre + "shortcut.convolution")
    return writers


_PATCH = ("its output is the patch embedding, which becomes the residual stream (d_model) that "
          "many layers read: no list of readers can widen it")


def _patch_embeddings(model: nn.Module) -> list[LayerPlan]:
    """The patch projection of a vision Transformer or ConvNeXt (a layer named
    ``patch_embed*``, or its ``projection``/``proj``): its output channels are the model's
    width. Found by name, also where the model does not trace."""
    out = []
    for path, m in model.named_modules():
        parts = path.split(".")
        named = parts[-1].startswith("patch_embed") or parts[-1] in ("projection", "proj") \
            and any(part.startswith("patch_embed") for part in parts[-3:-1])
        if named and is_producer(m):
            out.append(refuse(path, _PATCH, "patch embedding"))
    return out


_HEAD_NAMES = ("classifier", "score", "lm_head", "qa_outputs")


def _hf_heads(model: nn.Module) -> list[LayerPlan]:
    """A Hugging Face model's output head (``classifier``, ``score``, ``lm_head``; the last
    layer of a ``classifier`` Sequential): its width is the number of labels or the
    vocabulary, so no reader can take new neurons. Found by the config's sizes, also where
    the model does not trace."""
    config = getattr(model, "config", None)
    sizes = {getattr(config, k, None) for k in ("num_labels", "vocab_size")} - {None}
    if not sizes or not hasattr(config, "to_dict"):
        return []
    producers = [(path, m) for path, m in model.named_modules() if path and is_producer(m)]
    last_in = {path.rpartition(".")[0]: path for path, _ in producers}  # parent -> its last
    out = []
    for path, m in producers:
        parent, _, name = path.rpartition(".")
        named = name in _HEAD_NAMES or parent.rpartition(".")[2] in _HEAD_NAMES \
            and last_in[parent] == path
        if named and width_of(m, "out") in sizes:
            out.append(refuse(path, "its output is an output of the model (its width is the "
                                    "number of labels or the vocabulary)", "model head"))
    return out
