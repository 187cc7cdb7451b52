"""Hugging Face models at a tiny size, built from their configs (no downloads), with one batch
of inputs each: the Transformers part of ``model_sweep.py``. Base models (no head): the sweep
reads ``last_hidden_state``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

Inputs = dict[str, torch.Tensor]

_LAYERS = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64)
_AUDIO = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
              conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
              num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
_SEQ2SEQ = dict(encoder_layers=1, decoder_layers=1, d_model=32, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=64)


def _text() -> Inputs:
    return {"input_ids": torch.randint(3, 60, (2, 8), generator=_gen())}


def _text_pair() -> Inputs:
    return {**_text(), "decoder_input_ids": torch.randint(3, 60, (2, 4), generator=_gen())}


def _image() -> Inputs:
    return {"pixel_values": torch.randn(2, 3, 32, 32, generator=_gen())}


def _audio() -> Inputs:
    return {"input_values": torch.randn(2, 400, generator=_gen())}


def _speech_pair() -> Inputs:
    return {"input_features": torch.randn(2, 8, 16, generator=_gen()),
            "decoder_input_ids": torch.randint(3, 60, (2, 4), generator=_gen())}


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _specs(t) -> dict[str, tuple[Callable[[], nn.Module], Callable[[], Inputs]]]:
    """name -> (builder, inputs); ``t`` is the transformers module."""
    return {
        "gpt2": (lambda: t.GPT2Model(t.GPT2Config(n_layer=2, n_embd=32, n_head=2,
                                                   vocab_size=64)), _text),
        "gpt_neo": (lambda: t.GPTNeoModel(t.GPTNeoConfig(
            num_layers=2, hidden_size=32, num_heads=2, vocab_size=64, intermediate_size=64,
            attention_types=[[["global"], 2]])), _text),
        "gpt_bigcode": (lambda: t.GPTBigCodeModel(t.GPTBigCodeConfig(
            vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_inner=64)), _text),
        "gpt_neox": (lambda: t.GPTNeoXModel(t.GPTNeoXConfig(vocab_size=64, **_LAYERS)), _text),
        "llama": (lambda: t.LlamaModel(t.LlamaConfig(vocab_size=64, num_key_value_heads=2,
                                                     **_LAYERS)), _text),
        "mistral": (lambda: t.MistralModel(t.MistralConfig(vocab_size=64, num_key_value_heads=2,
                                                           **_LAYERS)), _text),
        "qwen2": (lambda: t.Qwen2Model(t.Qwen2Config(vocab_size=64, num_key_value_heads=2,
                                                     **_LAYERS)), _text),
        "gemma": (lambda: t.GemmaModel(t.GemmaConfig(vocab_size=64, num_key_value_heads=2,
                                                     head_dim=16, **_LAYERS)), _text),
        "phi": (lambda: t.PhiModel(t.PhiConfig(vocab_size=64, **_LAYERS)), _text),
        "qwen3": (lambda: t.Qwen3Model(t.Qwen3Config(vocab_size=64, num_key_value_heads=2,
                                                     head_dim=16, **_LAYERS)), _text),
        "gemma2": (lambda: t.Gemma2Model(t.Gemma2Config(vocab_size=64, num_key_value_heads=2,
                                                       head_dim=16, **_LAYERS)), _text),
        "olmo2": (lambda: t.Olmo2Model(t.Olmo2Config(vocab_size=64, num_key_value_heads=2,
                                                     **_LAYERS)), _text),
        "nemotron": (lambda: t.NemotronModel(t.NemotronConfig(
            vocab_size=64, num_key_value_heads=2, **_LAYERS)), _text),
        "mpt": (lambda: t.MptModel(t.MptConfig(d_model=32, n_heads=2, n_layers=2, vocab_size=64,
                                               expansion_ratio=2)), _text),
        "granite4": (lambda: t.GraniteMoeHybridModel(t.GraniteMoeHybridConfig(
            vocab_size=64, num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1,
            shared_intermediate_size=64, layer_types=["mamba", "attention"], mamba_d_state=4,
            mamba_n_heads=4, mamba_d_head=16, **_LAYERS)), _text),
        "mixtral": (lambda: t.MixtralModel(t.MixtralConfig(
            vocab_size=64, num_key_value_heads=2, num_local_experts=2, **_LAYERS)), _text),
        "qwen3_moe": (lambda: t.Qwen3MoeModel(t.Qwen3MoeConfig(
            vocab_size=64, num_key_value_heads=2, head_dim=16, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32, **_LAYERS)), _text),
        "deepseek_v3": (lambda: t.DeepseekV3Model(t.DeepseekV3Config(
            vocab_size=64, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1,
            **_LAYERS)), _text),
        "gpt_oss": (lambda: t.GptOssModel(t.GptOssConfig(
            vocab_size=64, num_key_value_heads=2, head_dim=16, num_local_experts=4,
            num_experts_per_tok=2, **_LAYERS)), _text),
        "llama4_text": (lambda: t.Llama4TextModel(t.Llama4TextConfig(
            vocab_size=64, num_key_value_heads=2, head_dim=16, num_local_experts=2,
            num_experts_per_tok=1, intermediate_size_mlp=64, **_LAYERS)), _text),
        "phimoe": (lambda: t.PhimoeModel(t.PhimoeConfig(
            vocab_size=64, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            **_LAYERS)), _text),
        "falcon": (lambda: t.FalconModel(t.FalconConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, vocab_size=64)), _text),
        "bloom": (lambda: t.BloomModel(t.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2,
                                                     n_head=2)), _text),
        "phi3": (lambda: t.Phi3Model(t.Phi3Config(vocab_size=64, num_key_value_heads=2,
                                                  pad_token_id=0, **_LAYERS)), _text),
        "glm": (lambda: t.GlmModel(t.GlmConfig(vocab_size=64, num_key_value_heads=2,
                                               head_dim=16, pad_token_id=0, **_LAYERS)), _text),
        "opt": (lambda: t.OPTModel(t.OPTConfig(vocab_size=64, hidden_size=32, ffn_dim=64,
                                               num_hidden_layers=2, num_attention_heads=2,
                                               word_embed_proj_dim=32)), _text),
        "bert": (lambda: t.BertModel(t.BertConfig(vocab_size=64, **_LAYERS)), _text),
        "distilbert": (lambda: t.DistilBertModel(t.DistilBertConfig(
            vocab_size=64, dim=32, hidden_dim=64, n_layers=2, n_heads=2)), _text),
        "albert": (lambda: t.AlbertModel(t.AlbertConfig(vocab_size=64, embedding_size=16,
                                                        **_LAYERS)), _text),
        "modernbert": (lambda: t.ModernBertModel(t.ModernBertConfig(
            vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
            sep_token_id=2, **_LAYERS)), _text),
        "mpnet": (lambda: t.MPNetModel(t.MPNetConfig(vocab_size=64, **_LAYERS)), _text),
        "xlm_roberta": (lambda: t.XLMRobertaModel(t.XLMRobertaConfig(vocab_size=64, **_LAYERS)),
                        _text),
        "roberta": (lambda: t.RobertaModel(t.RobertaConfig(vocab_size=64, **_LAYERS)), _text),
        "deberta_v2": (lambda: t.DebertaV2Model(t.DebertaV2Config(vocab_size=64, **_LAYERS)),
                       _text),
        "electra": (lambda: t.ElectraModel(t.ElectraConfig(vocab_size=64, embedding_size=32,
                                                           **_LAYERS)), _text),
        "xlnet": (lambda: t.XLNetModel(t.XLNetConfig(d_model=32, n_layer=2, n_head=2, d_inner=64,
                                                     vocab_size=64)), _text),
        "funnel": (lambda: t.FunnelModel(t.FunnelConfig(d_model=32, n_head=2, d_head=16,
                                                        d_inner=64, block_sizes=[1, 1],
                                                        vocab_size=64)), _text),
        "t5": (lambda: t.T5Model(t.T5Config(num_layers=1, d_model=32, d_ff=64, num_heads=2,
                                            d_kv=16, vocab_size=64)), _text_pair),
        "bart": (lambda: t.BartModel(t.BartConfig(**_SEQ2SEQ)), _text_pair),
        "whisper": (lambda: t.WhisperModel(t.WhisperConfig(
            num_mel_bins=8, max_source_positions=8, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=1, **_SEQ2SEQ)), _speech_pair),
        "vit": (lambda: t.ViTModel(t.ViTConfig(image_size=32, patch_size=8, **_LAYERS)), _image),
        "deit": (lambda: t.DeiTModel(t.DeiTConfig(image_size=32, patch_size=8, **_LAYERS)),
                 _image),
        "beit": (lambda: t.BeitModel(t.BeitConfig(image_size=32, patch_size=8, **_LAYERS)),
                 _image),
        "dinov2": (lambda: t.Dinov2Model(t.Dinov2Config(
            image_size=32, patch_size=8, num_hidden_layers=2, hidden_size=32,
            num_attention_heads=2)), _image),
        "siglip_vision": (lambda: t.SiglipVisionModel(t.SiglipVisionConfig(
            image_size=32, patch_size=8, **_LAYERS)), _image),
        "clip_vision": (lambda: t.CLIPVisionModel(t.CLIPVisionConfig(
            image_size=32, patch_size=8, **_LAYERS)), _image),
        "vitdet": (lambda: t.VitDetModel(t.VitDetConfig(image_size=32, pretrain_image_size=32,
                                                        patch_size=8, **_LAYERS)), _image),
        "pvt": (lambda: t.PvtModel(t.PvtConfig(image_size=32, hidden_sizes=[16, 32, 32, 32],
                                               depths=[1, 1, 1, 1],
                                               num_attention_heads=[1, 1, 1, 1])), _image),
        "pvt_v2": (lambda: t.PvtV2Model(t.PvtV2Config(
            image_size=32, hidden_sizes=[16, 32, 32, 32], depths=[1, 1, 1, 1],
            num_attention_heads=[1, 1, 1, 1])), _image),
        "focalnet": (lambda: t.FocalNetModel(t.FocalNetConfig(
            image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], focal_levels=[1, 1],
            focal_windows=[3, 3])), _image),
        "swin": (lambda: t.SwinModel(t.SwinConfig(image_size=32, patch_size=4, embed_dim=16,
                                                  depths=[1, 1], num_heads=[2, 2],
                                                  window_size=4)), _image),
        "swinv2": (lambda: t.Swinv2Model(t.Swinv2Config(
            image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
            window_size=4)), _image),
        "convnext": (lambda: t.ConvNextModel(t.ConvNextConfig(hidden_sizes=[16, 32],
                                                              depths=[1, 1], num_stages=2)),
                     _image),
        "convnextv2": (lambda: t.ConvNextV2Model(t.ConvNextV2Config(
            hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)), _image),
        "levit": (lambda: t.LevitModel(t.LevitConfig(
            image_size=32, hidden_sizes=[16, 32, 48], num_attention_heads=[1, 2, 3],
            depths=[1, 1, 1], key_dim=[8, 8, 8], patch_size=16)), _image),
        "poolformer": (lambda: t.PoolFormerModel(t.PoolFormerConfig(
            hidden_sizes=[16, 32, 32, 32], depths=[1, 1, 1, 1])), _image),
        "bit": (lambda: t.BitModel(t.BitConfig(embedding_size=32, hidden_sizes=[32, 64],
                                               depths=[1, 1], num_groups=8)), _image),
        "regnet": (lambda: t.RegNetModel(t.RegNetConfig(
            embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8)), _image),
        "resnet": (lambda: t.ResNetModel(t.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32],
                                                        depths=[1, 1], layer_type="basic")),
                   _image),
        "mobilenet_v1": (lambda: t.MobileNetV1Model(t.MobileNetV1Config(
            image_size=32, depth_multiplier=0.25)), _image),
        "mobilenet_v2": (lambda: t.MobileNetV2Model(t.MobileNetV2Config(
            image_size=32, depth_multiplier=0.25)), _image),
        "efficientnet": (lambda: t.EfficientNetModel(t.EfficientNetConfig(
            image_size=32, width_coefficient=0.25, depth_coefficient=0.2, hidden_dim=320)),
            _image),
        "mobilevit": (lambda: t.MobileViTModel(t.MobileViTConfig(
            image_size=32, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24,
                                                                          64])), _image),
        "segformer": (lambda: t.SegformerModel(t.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
            num_attention_heads=[1, 2], strides=[4, 2], patch_sizes=[7, 3],
            mlp_ratios=[2, 2])), _image),
        "wav2vec2": (lambda: t.Wav2Vec2Model(t.Wav2Vec2Config(**_AUDIO)), _audio),
        "hubert": (lambda: t.HubertModel(t.HubertConfig(**_AUDIO)), _audio),
    }


def hf_models() -> dict[str, tuple[Callable[[], nn.Module], Callable[[], Inputs]]]:
    """Every model of this module: name -> (builder, inputs). Raises ImportError without
    transformers."""
    import transformers

    return _specs(transformers)

