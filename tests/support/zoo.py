"""The model zoo the zoo tests share: real architectures built from a config or a
constructor at a tiny size (no downloads, no pretrained weights), with a batch, a learnable
toy target, the ``perforate`` arguments each needs and what it wraps by default.

Every builder seeds torch, so two calls give bit-identical models (a fresh model to load
into). torchvision's and timm's models are listed only when they import (torchvision must be
built for the installed torch: the CUDA wheel fails to import against a CPU torch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class ZooModel:
    """One zoo entry: how to build it, feed it, train it and perforate it."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], dict[str, torch.Tensor]]
    loss: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
    output: Callable[[Any], torch.Tensor]
    wrapped: dict[str, int]                       # class name -> count, default perforate
    skipped: list[str] = field(default_factory=list)  # paths perforate skips, with a reason
    perforate_kwargs: dict[str, Any] = field(default_factory=dict)
    hf: bool = False
    onnx: bool = True                             # does the base model export to ONNX here


def _seeded(fn: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return fn().eval()
    return build


def _ids(vocab: int, batch: int = 2, seq: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _images(size: int = 32, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _logits(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits


def _lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch, labels=batch["input_ids"]).loss


def _hf_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def _image_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(_logits(model(batch["x"])), batch["labels"])


# --------------------------------------------------------------------- Hugging Face models
def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                      n_positions=16, bos_token_id=0, eos_token_id=0))


def _llama(tied: bool) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
            tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0, pad_token_id=0))
    return build


def _bert_config():
    from transformers import BertConfig
    return BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=16,
                      num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _bert_cls() -> nn.Module:
    from transformers import BertForSequenceClassification
    return BertForSequenceClassification(_bert_config())


def _bert_mlm() -> nn.Module:
    from transformers import BertForMaskedLM
    return BertForMaskedLM(_bert_config())


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
        num_heads=2, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1))


def _hf_vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, num_labels=3,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def _hf_resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification
    return ResNetForImageClassification(ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
        num_labels=3))


def _hf_mobilenet() -> nn.Module:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    return MobileNetV2ForImageClassification(MobileNetV2Config(
        image_size=32, depth_multiplier=0.25, num_labels=3, classifier_dropout_prob=0.0))


def _hf_efficientnet() -> nn.Module:
    from transformers import EfficientNetConfig, EfficientNetForImageClassification
    return EfficientNetForImageClassification(EfficientNetConfig(
        image_size=32, width_coefficient=0.25, depth_coefficient=0.25, num_labels=3,
        hidden_dim=320, drop_connect_rate=0.0, dropout_rate=0.0))


def _lm_batch() -> dict[str, torch.Tensor]:
    return {"input_ids": _ids(64)}


def _cls_batch() -> dict[str, torch.Tensor]:
    return {"input_ids": _ids(64), "labels": torch.tensor([0, 2])}


def _mlm_batch() -> dict[str, torch.Tensor]:
    ids = _ids(64)
    return {"input_ids": ids, "labels": ids.flip(1)}


def _t5_batch() -> dict[str, torch.Tensor]:
    return {"input_ids": _ids(64), "labels": _ids(64, seq=4, seed=2)}


def _pixels() -> dict[str, torch.Tensor]:
    return {"pixel_values": _images(), "labels": torch.tensor([0, 2])}


def _images_batch() -> dict[str, torch.Tensor]:
    return {"x": _images(), "labels": torch.tensor([0, 2])}


CONV1D = {"names": ["Conv1D"], "types": (nn.Linear,), "neuron_axes": {"Conv1D": -1}}


def hf_models() -> list[ZooModel]:
    """The Hugging Face part of the zoo (transformers is a dev dependency)."""
    return [
        ZooModel("gpt2", _seeded(_gpt2), _lm_batch, _lm_loss, _logits,
                 wrapped={"Conv1D": 8}, skipped=["lm_head"], hf=True),
        ZooModel("llama-tied", _seeded(_llama(True)), _lm_batch, _lm_loss, _logits,
                 wrapped={"Linear": 14}, skipped=["lm_head"], hf=True),
        ZooModel("llama-untied", _seeded(_llama(False)), _lm_batch, _lm_loss, _logits,
                 wrapped={"Linear": 15}, hf=True),
        ZooModel("bert-cls", _seeded(_bert_cls), _cls_batch, _hf_loss, _logits,
                 wrapped={"Linear": 14}, hf=True),
        ZooModel("bert-mlm", _seeded(_bert_mlm), _mlm_batch, _hf_loss, _logits,
                 wrapped={"Linear": 13}, skipped=["cls.predictions.decoder"], hf=True),
        ZooModel("t5", _seeded(_t5), _t5_batch, _hf_loss, _logits,
                 wrapped={"Linear": 16}, skipped=["lm_head"], hf=True),
        ZooModel("hf-vit", _seeded(_hf_vit), _pixels, _hf_loss, _logits,
                 wrapped={"Linear": 13, "Conv2d": 1}, hf=True),
        ZooModel("hf-resnet", _seeded(_hf_resnet), _pixels, _hf_loss, _logits,
                 wrapped={"Conv2d": 6, "Linear": 1}, hf=True),
        ZooModel("hf-mobilenet-v2", _seeded(_hf_mobilenet), _pixels, _hf_loss, _logits,
                 wrapped={"Conv2d": 52, "Linear": 1}, hf=True),
        ZooModel("hf-efficientnet", _seeded(_hf_efficientnet), _pixels, _hf_loss, _logits,
                 wrapped={"Conv2d": 29, "EfficientNetDepthwiseConv2d": 7, "Linear": 1},
                 hf=True),
    ]


# --------------------------------------------------------------------- torchvision models
def torchvision_error() -> str | None:
    """Why torchvision's models cannot be built here, or None when they can."""
    try:
        import torchvision.models  # noqa: F401
    except Exception as exc:  # a wheel built for another torch fails with RuntimeError
        return f"torchvision does not import with this torch ({type(exc).__name__}: {exc})"
    return None


def _tv(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision.models as tvm
        return getattr(tvm, name)(weights=None, num_classes=3, **kwargs)
    return build


def _tv_vit() -> nn.Module:
    """ViT-B/16's class at a tiny size (``vit_b_16`` itself fixes the sizes)."""
    from torchvision.models import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2,
                             hidden_dim=32, mlp_dim=64, num_classes=3)


def torchvision_models() -> list[ZooModel]:
    """ResNet-18, MobileNetV3-small and ViT-B/16 (shrunk) from torchvision's constructors."""
    return [
        ZooModel("tv-resnet18", _seeded(_tv("resnet18")), _images_batch, _image_loss,
                 _logits, wrapped={"Conv2d": 20, "Linear": 1}),
        ZooModel("tv-mobilenet-v3-small", _seeded(_tv("mobilenet_v3_small")), _images_batch,
                 _image_loss, _logits, wrapped={"Conv2d": 52, "Linear": 2}),
        ZooModel("tv-vit-b16", _seeded(_tv_vit),
                 _images_batch, _image_loss, _logits, wrapped={"Conv2d": 1, "Linear": 5},
                 skipped=["encoder.layers.encoder_layer_0.self_attention.out_proj"]),
    ]


class Feed(nn.Module):
    """The model called with a batch's tensors by position, returning its logits: one
    signature for eager, ``torch.compile``, ``torch.export`` and ONNX."""

    def __init__(self, model: nn.Module, keys: list[str], hf: bool) -> None:
        super().__init__()
        self.model, self.keys, self.hf = model, keys, hf

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        if self.hf:
            return self.model(**dict(zip(self.keys, tensors))).logits
        return _logits(self.model(tensors[0]))


def feed(zoo: ZooModel, model: nn.Module) -> tuple[Feed, tuple[torch.Tensor, ...]]:
    """``Feed`` for ``model`` and the positional tensors of the zoo entry's batch."""
    batch = zoo.inputs()
    keys = [k for k in batch if zoo.hf or k == "x"]
    return Feed(model, keys, zoo.hf), tuple(batch[k] for k in keys)


# --------------------------------------------------------------------------- timm models
def timm_error() -> str | None:
    """Why timm's models cannot be built here, or None when they can (timm needs
    torchvision, so it installs only where torchvision does)."""
    try:
        import timm  # noqa: F401
    except Exception as exc:
        return f"timm does not import here ({type(exc).__name__}: {exc})"
    return None


def _timm_vit() -> nn.Module:
    import timm
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3,
                             img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                             mlp_ratio=2.0)


def timm_models() -> list[ZooModel]:
    """A timm ViT (shrunk), from ``timm.create_model`` without pretrained weights."""
    return [ZooModel("timm-vit", _seeded(_timm_vit), _images_batch, _image_loss, _logits,
                     wrapped={"Conv2d": 1, "Linear": 9})]


def all_models() -> list[ZooModel]:
    """The Hugging Face models, plus torchvision's and timm's where they import."""
    return (hf_models() + ([] if torchvision_error() else torchvision_models())
            + ([] if timm_error() else timm_models()))
