"""The decomposition table to apply before ``compile_aten_graph``.

Start from ``torch._decomp.core_aten_decompositions()`` and add the composite ops whose pieces fuse
better than the whole: softmax, log_softmax and the norms become amax/sum/exp/... that the scheduler
puts into one kernel; gelu/silu become pointwise math. Removed from the table (lowered directly):
``var_mean``/``var`` (two-pass mean and squared deviations, instead of prims ops), ops we keep as
extern calls (matmul, convolution, attention), and random ops (as ``ember.aot`` does).
"""
from __future__ import annotations

import functools

import torch
from torch._decomp import get_decompositions

from ember.aot.lazy_table import ABSENT, LazyTable
from ember.aot.ops import core_aten_table, is_random_op
from ember.native import ops

aten = torch.ops.aten

_EXTRA = [
    aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
    aten.native_layer_norm, aten.native_layer_norm_backward, aten.native_group_norm,
    aten.native_group_norm_backward, aten.native_batch_norm, aten._native_batch_norm_legit,
    aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
    aten.native_batch_norm_backward, aten.gelu, aten.gelu_backward, aten.silu, aten.silu_backward,
    aten.nll_loss_forward, aten.nll_loss_backward, aten.nll_loss2d_forward, aten.nll_loss2d_backward,
    aten.full_like, aten.logsumexp, aten.std, aten.std_mean, aten.mse_loss, aten.mse_loss_backward,
    aten.threshold_backward, aten.tanh_backward, aten.sigmoid_backward,
    aten.rms_norm, aten._fused_rms_norm, aten.binary_cross_entropy_with_logits, aten.smooth_l1_loss,
    aten.huber_loss, aten.l1_loss, aten.soft_margin_loss, aten.tril, aten.triu, aten.masked_fill,
    aten.addcmul, aten.addcdiv, aten.lerp, aten.hardswish, aten.hardsigmoid, aten.mish, aten.softplus,
    aten.elu_backward, aten.leaky_relu_backward, aten.hardtanh_backward,
    # whole, their fake (meta) results give float32 running statistics where the CPU kernel returns
    # the input's dtype: a bf16 BatchNorm's running stats were read as float32 (garbage)
    aten._batch_norm_with_update, aten._batch_norm_with_update_functional, aten._batch_norm_no_update,
]

# lowered directly (see lower_ops.py) or kept as extern calls. The embedding's backward stays ATen's
# (eager's kernel: its gradient bit for bit, scale_grad_by_freq included). Decomposed, it became zeros
# + index_put(accumulate=True), an extern too (the scheduler has no scatter stores), whose ATen path
# adds min/max/remainder/assert launches on the indices and loads kernels eager never uses: 133 ms of
# CPU in GPT-2 training's warm first step on the H100 (gpt2_train-first-step-h100-s41.txt; that step
# 0.50 -> 0.30 s and 0.31 -> 0.29 s in two paired runs: embedding_backward_ab-h100-s41.json)
_KEEP = [aten.var_mean.correction, aten.var.correction, aten.addmm.default, aten.mm.default, aten.bmm.default,
         aten.convolution.default, aten.convolution_backward.default, aten.embedding.default,
         aten.embedding_dense_backward.default,
         aten.index_select.default, aten.gather.default, aten.cat.default, aten.constant_pad_nd.default]


def _build():
    table = dict(core_aten_table())
    table.update(get_decompositions(_EXTRA))
    for op in _KEEP + ops.WHOLE:  # WHOLE: pointwise ops the registry lowers as they are (logit)
        table.pop(op, None)
    # random ops stay whole (extern calls drawing from eager's generator the way eager does); this
    # also keeps scaled_dot_product_attention whole, so it becomes the flash/efficient extern kernel
    for op in [op for op in table if torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())]:
        del table[op]
    return table


@functools.lru_cache(maxsize=1)
def _parts() -> tuple:
    """(the _EXTRA decompositions, the ops kept whole), made at the first lookup, as _build makes them."""
    return get_decompositions(_EXTRA), frozenset(_KEEP + ops.WHOLE)


def _lookup(op):
    """_build's answer for one op (tests/aot/test_lazy_table.py compares every op's)."""
    extra, whole = _parts()
    if op in whole or is_random_op(op):
        return ABSENT
    fn = extra.get(op, ABSENT)
    return core_aten_table().resolve(op) if fn is ABSENT else fn


def _aot_lookup(op):
    return None if op in _parts()[1] else DECOMPOSITIONS.resolve(op)


# answered op by op as traces ask, built whole only if iterated (``ember.aot.lazy_table``)
DECOMPOSITIONS = LazyTable("native", _build, _lookup)
# for ember.aot, whose table starts from core ATen: the ops lowered here whole are taken out of it too
AOT_DECOMPOSITIONS = LazyTable("native.aot", lambda: {**DECOMPOSITIONS, **dict.fromkeys(_KEEP + ops.WHOLE)},
                               _aot_lookup)
