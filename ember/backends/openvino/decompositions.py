"""Decompositions the openvino backend adds to ember's default table.

PyTorch's transformer modules take a "fast path" in inference: one fused ATen op per layer
(``_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``). torch has no decomposition for
them and OpenVINO no conversion rule, so a whole encoder layer would stay in PyTorch as one opaque op.
Written out in ordinary ops (linear, scaled_dot_product_attention, layer_norm), the layer converts.

Each function returns ``NotImplemented`` for the cases it does not cover (masks, attention weights,
nested tensors); the op then stays as it is and runs in PyTorch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def _split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, e = t.shape
    return t.view(b, n, heads, e // heads).transpose(1, 2)


def _merge_heads(t: torch.Tensor) -> torch.Tensor:
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    """nn.TransformerEncoderLayer's fast path (batch_first, dropout off), as the module computes it."""
    if mask is not None or src.dim() != 3 or src.is_nested:
        return NotImplemented

    def attention(x):
        q, k, v = F.linear(x, qkv_weight, qkv_bias).chunk(3, dim=-1)
        out = F.scaled_dot_product_attention(_split_heads(q, num_heads), _split_heads(k, num_heads),
                                             _split_heads(v, num_heads))
        return F.linear(_merge_heads(out), proj_weight, proj_bias)

    def feed_forward(x):
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(hidden) if use_gelu else F.relu(hidden), ffn_weight_2, ffn_bias_2)

    def norm1(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    if norm_first:
        x = src + attention(norm1(src))
        return x + feed_forward(norm2(x))
    x = norm1(src + attention(src))
    return norm2(x + feed_forward(x))


def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                mask_type=None):
    """nn.MultiheadAttention's fast path (batch_first, no mask, no attention weights returned)."""
    if mask is not None or need_weights or query.dim() != 3 or query.is_nested:
        return NotImplemented
    w_q, w_k, w_v = qkv_weight.chunk(3)
    b_q, b_k, b_v = qkv_bias.chunk(3)
    q = _split_heads(F.linear(query, w_q, b_q), num_head)
    k = _split_heads(F.linear(key, w_k, b_k), num_head)
    v = _split_heads(F.linear(value, w_v, b_v), num_head)
    out = F.linear(_merge_heads(F.scaled_dot_product_attention(q, k, v)), proj_weight, proj_bias)
    return out, None  # eager returns no weights either (an undefined tensor)


TABLE = {
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
    aten._native_multi_head_attention.default: native_multi_head_attention,
}
