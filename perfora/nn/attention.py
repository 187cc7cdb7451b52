"""Make PyTorch's attention and Transformer modules call the layers perfora wraps.

``nn.MultiheadAttention`` does not call its ``out_proj``: it hands ``out_proj.weight`` to a
fused function. ``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder`` have inference
fast paths that read ``linear1.weight`` and friends the same way. Dendrites on such a layer
would never run. This module does two things about it:

* :func:`is_attention_projection` names the layers that are read directly, so
  :func:`perfora.perforate` skips them unless the user asks for them by path;
* :func:`route_wrapped_layers` makes the modules around wrapped layers call them: an
  attention whose ``out_proj`` is wrapped computes its heads with an identity projection
  (multiplying by 1 and adding zeros is exact) and then calls ``out_proj``; Transformer
  layers and encoders that hold wrapped layers have their fused fast paths switched off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import DendriticLayer


def is_attention_projection(parent: nn.Module, child_name: str) -> bool:
    """True for ``out_proj`` of an ``nn.MultiheadAttention``, whose weight is read directly."""
    return isinstance(parent, nn.MultiheadAttention) and child_name == "out_proj"


class _RoutedAttentionMixin:
    """``forward`` of an ``nn.MultiheadAttention`` whose ``out_proj`` is a DendriticLayer."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        batched = query.dim() == 3
        swap = self.batch_first and batched
        if swap:  # the functional form wants (sequence, batch, features)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        identity = torch.eye(self.embed_dim, dtype=query.dtype, device=query.device)
        separate = not self._qkv_same_embed_dim
        heads, weights = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight,
            self.in_proj_bias, self.bias_k, self.bias_v, self.add_zero_attn, self.dropout,
            identity, None, training=self.training, key_padding_mask=key_padding_mask,
            need_weights=need_weights, attn_mask=attn_mask,
            use_separate_proj_weight=separate,
            q_proj_weight=self.q_proj_weight if separate else None,
            k_proj_weight=self.k_proj_weight if separate else None,
            v_proj_weight=self.v_proj_weight if separate else None,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        if swap:
            heads = heads.transpose(0, 1)
        return self.out_proj(heads), weights


class RoutedMultiheadAttention(_RoutedAttentionMixin, nn.MultiheadAttention):
    """``nn.MultiheadAttention`` that calls its (wrapped) ``out_proj``; same state dict."""


_ROUTED_CLASSES: dict[type, type] = {nn.MultiheadAttention: RoutedMultiheadAttention}


def _routed_class(cls: type) -> type:
    """A subclass of ``cls`` (cached per class) with the routed forward."""
    if issubclass(cls, _RoutedAttentionMixin):
        return cls
    if cls not in _ROUTED_CLASSES:
        _ROUTED_CLASSES[cls] = type(f"Routed{cls.__name__}", (_RoutedAttentionMixin, cls),
                                    {"__module__": __name__})
    return _ROUTED_CLASSES[cls]


def route_wrapped_layers(root: nn.Module) -> list[str]:
    """Make the modules around wrapped layers call them; returns what was changed (paths)."""
    changed: list[str] = []
    for path, module in root.named_modules():
        holds_wrapped = any(isinstance(m, DendriticLayer) for m in module.modules())
        if not holds_wrapped:
            continue
        if isinstance(module, nn.MultiheadAttention) and isinstance(module.out_proj,
                                                                     DendriticLayer):
            if not isinstance(module, _RoutedAttentionMixin):
                module.__class__ = _routed_class(type(module))
                changed.append(path)
        elif isinstance(module, nn.TransformerEncoderLayer) and module.activation_relu_or_gelu:
            # the fused inference kernel reads linear1/linear2/out_proj weights itself; this
            # flag is one of its preconditions and is used for nothing else
            module.activation_relu_or_gelu = False
            changed.append(path)
        elif isinstance(module, nn.TransformerEncoder) and getattr(module, "use_nested_tensor",
                                                                   False):
            module.use_nested_tensor = False  # its fast path reads the first layer's weights
            changed.append(path)
    return changed
