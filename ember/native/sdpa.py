"""FX rewrite of CUDA inference attention: cuDNN's SDPA -> FlashAttention-2 (``NativeOptions.sdpa_flash``).

Why: ``aten._scaled_dot_product_cudnn_attention`` (what ``F.scaled_dot_product_attention`` dispatches
to on an H100 for bf16/fp16) zeroes a one-element philox seed and offset on every call, dropout or
not (``at::zeros({1})`` twice in ATen's ``_scaled_dot_product_cudnn_attention_cuda``): two
``Memset`` nodes per attention layer beside the attention kernel (GPT-2 124M inference: 24 of the
25 memsets per call in session 39's reduce-overhead profile, 0.019 ms plus a launch gap each in a
replayed CUDA graph). ``aten._scaled_dot_product_flash_attention`` launches the attention kernel
alone when there is no dropout. Which kernel is faster depends on the shapes: off by default until
``benchmarks/probes/gpt2_infer_ab.py`` measures it on the H100 (its ``sdpa_backends`` section and the
``after+flash`` variant).

When: inference only (no logsumexp asked for, so no backward will want cuDNN's), no attention bias, no
dropout, no debug mask, and only the attention output is read; q/k/v fp16/bf16 on CUDA, the same
head dim, at most 256 and a multiple of 8, the same number of heads, each with stride 1 along the
head dim (FlashAttention-2's own conditions, ``sdp_utils.cpp``). The result's layout is the same for
both ops (their meta functions: [B, H, L, D] over a [B, L, H, D] buffer), so the views after it hold.
"""
from __future__ import annotations

import operator

import torch

aten = torch.ops.aten
CUDNN = aten._scaled_dot_product_cudnn_attention.default
FLASH = aten._scaled_dot_product_flash_attention.default
DTYPES = (torch.float16, torch.bfloat16)


def _arg(node, i, name, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _flash_ok(q, k, v, on_cpu: bool) -> bool:
    vals = (q, k, v)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in vals):
        return False
    if not (all(t.device.type == "cuda" for t in vals) or on_cpu) or len({t.dtype for t in vals}) != 1:
        return False
    d = q.shape[-1]
    return (q.dtype in DTYPES and isinstance(d, int) and d % 8 == 0 and d <= 256
            and k.shape[-1] == d and v.shape[-1] == d and q.shape[1] == k.shape[1] == v.shape[1]
            and all(t.stride(-1) == 1 for t in vals))


def cudnn_to_flash(gm: torch.fx.GraphModule, on_cpu: bool = False) -> int:
    """Rewrite the qualifying cuDNN attention nodes of ``gm`` in place; returns how many.
    ``on_cpu``: also CPU tensors (tests of the rewrite on fake tensors)."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not CUDNN:
            continue
        q, k, v = node.args[:3]
        bias, lse = _arg(node, 3, "attn_bias", None), _arg(node, 4, "compute_log_sumexp", True)
        dropout, causal = _arg(node, 5, "dropout_p", 0.0), _arg(node, 6, "is_causal", False)
        debug, scale = _arg(node, 7, "return_debug_mask", False), node.kwargs.get("scale")
        if bias is not None or lse or dropout or debug:
            continue
        # (only the output read; a traced graph may keep unread getitems of the others)
        if not all(u.target is operator.getitem and (u.args[1] == 0 or not u.users) for u in node.users):
            continue
        if not _flash_ok(*(x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in (q, k, v)), on_cpu):
            continue
        for u in [u for u in node.users if u.args[1] != 0]:
            gm.graph.erase_node(u)
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(FLASH, (q, k, v, 0.0, causal, False), {"scale": scale})
        new.meta.update({key: val for key, val in node.meta.items() if key != "val"})
        new.meta["ember_rewrite"] = "sdpa: cuDNN attention as FlashAttention-2 (no per-call memsets)"
        fake = node.meta["val"][0].fake_mode
        with fake:
            new.meta["val"] = FLASH(q.meta["val"], k.meta["val"], v.meta["val"], 0.0, causal, False, scale=scale)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
