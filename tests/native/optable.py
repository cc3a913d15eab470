"""The op table that drives the native-backend tests: every case runs its generated Triton kernels
(GPU, or the interpreter on CPU) against eager. Shapes are small and odd (mask tails), some inputs
non-contiguous or broadcast, some empty or size-1; ``LOOPED`` cases also run with tiny blocks so
reductions take several loop iterations and several programs.

``Case.kernels`` / ``Case.externs``: when set, the exact number of Triton kernels / extern calls the
graph must compile to (the structural fusion checks live in test_fusion.py).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

aten = torch.ops.aten
f32, f16, bf16, f64, i64, i32 = torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32
LOWP = (f32, f16, bf16)


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable
    make: Callable            # (dtype, device) -> list of inputs
    dtypes: tuple = (f32,)
    atol: float | None = None  # for fp32; other dtypes use the harness defaults
    rtol: float | None = None
    kernels: int | None = None
    externs: int | None = None
    looped: bool = False      # also run with tiny blocks (several loop iterations and programs)
    strides: bool = True      # compare output strides with eager


def R(*shape):
    return lambda dt, dev: torch.randn(shape, device=dev).to(dt)


def gen(*specs):
    """Inputs from specs: a shape tuple (randn), ('pos', shape), ('unit', shape), ('int', shape, lo, hi),
    ('bool', shape), ('nc', shape) (a transposed view), ('x', value) (a Python value)."""
    def make(dt, dev):
        out = []
        for s in specs:
            if isinstance(s, tuple) and (not s or isinstance(s[0], int)):
                out.append(torch.randn(s, device=dev).to(dt))
                continue
            kind = s[0]
            if kind == "pos":
                out.append((torch.rand(s[1], device=dev) * 3 + 0.1).to(dt))
            elif kind == "unit":
                out.append((torch.rand(s[1], device=dev) * 1.8 - 0.9).to(dt))
            elif kind == "int":
                out.append(torch.randint(s[2], s[3], s[1], device=dev, dtype=s[4] if len(s) > 4 else i64))
            elif kind == "bool":
                out.append(torch.rand(s[1], device=dev) > 0.5)
            elif kind == "nc":
                out.append(torch.randn(tuple(reversed(s[1])), device=dev).to(dt).t())
            elif kind == "special":
                t = torch.randn(s[1], device=dev)
                t.view(-1)[::5] = float("nan")
                t.view(-1)[1::7] = float("inf")
                t.view(-1)[2::11] = float("-inf")
                out.append(t.to(dt))
            elif kind == "x":
                out.append(s[1])
            else:
                raise ValueError(kind)
        return out
    return make


def _pool_input(dt, dev):
    """(2, 3, 9, 11) with a NaN, two NaNs in one window, a plane of -inf (padding must not win) and tied maxima."""
    t = torch.randn(2, 3, 9, 11, device=dev)
    t[0, 0, 1, 1] = float("nan")
    t[0, 0, 4, 4] = t[0, 0, 5, 5] = float("nan")
    t[0, 1] = float("-inf")
    t[1, 2, 2:6, 3:7] = 2.5
    return t.to(dt)


def _pool_ties(dt, dev):
    """(2, 3, 9, 11) of small integers: many tied maxima in overlapping windows."""
    return torch.randint(0, 3, (2, 3, 9, 11), device=dev).to(dt)


def _pool_bwd_inputs(x, k, s, p, ceil_mode=False):
    """[grad_out, x, indices] for max_pool2d_with_indices_backward: eager's indices of x, a random grad
    (integer-valued in part, so sums of several windows are exact in every dtype)."""
    y, idx = F.max_pool2d(x, k, s, p, ceil_mode=ceil_mode, return_indices=True)
    g = torch.randn(y.shape, device=x.device)
    g.view(-1)[::3] = torch.randint(-4, 5, g.view(-1)[::3].shape, device=x.device).float()
    g = g.to(x.dtype)
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        g = g.contiguous(memory_format=torch.channels_last)
    return [g, x, idx]


X = (13, 37)          # odd sizes: mask tails in x and r
X3 = (5, 7, 9)
g1 = gen(X)
unit = gen(("unit", X))
pos = gen(("pos", X))
C = Case

OPS: list[Case] = [
    # ---- unary pointwise ---------------------------------------------------------------------
    C("abs", torch.abs, g1, LOWP), C("neg", torch.neg, g1, LOWP), C("exp", torch.exp, g1, LOWP),
    C("exp2", torch.exp2, g1), C("expm1", torch.expm1, g1, atol=1e-5, rtol=1e-4), C("log", torch.log, pos, LOWP),
    C("log2", torch.log2, pos), C("log10", torch.log10, pos), C("log1p", torch.log1p, pos, rtol=1e-4),
    C("sqrt", torch.sqrt, pos, LOWP), C("rsqrt", torch.rsqrt, pos, LOWP), C("sin", torch.sin, g1),
    C("cos", torch.cos, g1), C("tan", torch.tan, unit, rtol=1e-4), C("tanh", torch.tanh, g1, LOWP, atol=1e-5, rtol=1e-4),
    C("sigmoid", torch.sigmoid, g1, LOWP), C("erf", torch.erf, g1), C("atan", torch.atan, g1, rtol=1e-4),
    C("asin", torch.asin, unit, rtol=1e-4, atol=1e-5), C("acos", torch.acos, unit, rtol=1e-4, atol=1e-5),
    C("sinh", torch.sinh, g1, rtol=1e-4), C("cosh", torch.cosh, g1, rtol=1e-4),
    C("reciprocal", torch.reciprocal, pos), C("floor", lambda x: torch.floor(x * 3), g1),
    C("ceil", lambda x: torch.ceil(x * 3), g1), C("round", lambda x: torch.round(x * 3), g1),
    C("trunc", lambda x: torch.trunc(x * 3), g1), C("frac", lambda x: torch.frac(x * 3), g1),
    C("sign", torch.sign, g1), C("relu", torch.relu, g1, LOWP), C("gelu", F.gelu, g1, LOWP),
    C("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), g1, atol=1e-5, rtol=1e-4),
    C("silu", F.silu, g1, LOWP), C("softplus", F.softplus, g1, rtol=1e-4), C("leaky_relu", F.leaky_relu, g1),
    C("elu", F.elu, g1, rtol=1e-4), C("hardtanh", F.hardtanh, g1), C("hardswish", F.hardswish, g1),
    C("hardsigmoid", F.hardsigmoid, g1), C("mish", F.mish, g1, atol=1e-5, rtol=1e-4), C("square", torch.square, g1),
    C("isnan_isinf", lambda x: (torch.isnan(x), torch.isinf(x), torch.isfinite(x)), gen(("special", X))),
    C("nan_to_num", lambda x: torch.nan_to_num(x, posinf=9.0, neginf=-9.0), gen(("special", X))),
    C("clamp", lambda x: torch.clamp(x, -0.5, 0.7), g1, LOWP), C("clamp_min", lambda x: x.clamp_min(0.1), g1),
    C("clamp_nan", lambda x: x.clamp(-1, 1), gen(("special", X))),
    C("logit_sigmoid_chain", lambda x: torch.log(torch.sigmoid(x)) * torch.tanh(x) + x.exp().sqrt(), g1, LOWP, rtol=1e-4),
    # ---- binary / ternary pointwise, broadcasting, scalars ------------------------------------
    C("add_bcast", lambda a, b: a + b, gen(X, (37,)), LOWP), C("sub_bcast_col", lambda a, b: a - b, gen(X, (13, 1)), LOWP),
    C("mul_outer", lambda a, b: a * b, gen((13, 1), (1, 37)), LOWP), C("div", torch.div, gen(X, ("pos", X)), LOWP),
    C("add_alpha", lambda a, b: torch.add(a, b, alpha=2.5), gen(X, X)), C("rsub", lambda a: 1 - a, g1),
    C("scalar_ops", lambda a: (a * 2.5 + 1) / 3 - 0.5, g1, LOWP), C("pow2", lambda a: a ** 2, g1, LOWP),
    C("pow_half", lambda a: a ** 0.5, pos), C("pow3", lambda a: a ** 3, g1), C("pow_neg1", lambda a: a ** -1, pos),
    C("pow_frac", lambda a: a ** 1.7, pos, rtol=1e-4), C("pow_tensor", torch.pow, gen(("pos", X), X), rtol=1e-4),
    C("maximum_nan", torch.maximum, gen(("special", X), X)), C("minimum", torch.minimum, gen(X, X), LOWP),
    C("atan2", torch.atan2, gen(X, X), rtol=1e-4, atol=1e-5), C("fmod", lambda a, b: torch.fmod(a * 5, b), gen(X, ("pos", X))),
    C("remainder", lambda a, b: torch.remainder(a * 5, b), gen(X, ("pos", X)), atol=1e-5, rtol=1e-5),
    C("floor_divide", lambda a, b: torch.floor_divide(a * 5, b), gen(X, ("pos", X))),
    C("where", lambda c, a, b: torch.where(c, a, b), gen(("bool", X), X, (37,)), LOWP),
    C("where_scalar", lambda a: torch.where(a > 0, a, 0.0), g1), C("compare", lambda a, b: (a < b, a >= b, a == a, a != b),
                                                                   gen(X, X)),
    C("logical", lambda a, b: (a & b, a | b, a ^ b, ~a), gen(("bool", X), ("bool", X))),
    C("int_arith", lambda a, b: (a + b * 3, a * b, a // b, a % b, torch.div(a, b, rounding_mode="trunc")),
      gen(("int", X, -50, 50), ("int", X, 1, 9))),
    C("int_bitwise", lambda a, b: (a & b, a | b, a ^ b, ~a), gen(("int", X, 0, 100), ("int", X, 0, 100))),
    C("int_true_div", lambda a, b: a / b, gen(("int", X, -50, 50), ("int", X, 1, 9))),
    C("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.5), gen(X, X, X)),
    C("lerp", lambda a, b: torch.lerp(a, b, 0.3), gen(X, X)),
    C("masked_fill", lambda a, m: a.masked_fill(m, -1.0), gen(X, ("bool", X))),
    C("casts", lambda a: (a.to(i64), a.to(f16), a.to(torch.bool), (a > 0).float(), a.to(i32).to(f32) * 2),
      gen(("pos", X))),
    C("mixed_dtype", lambda a, b: a * b + 1, lambda dt, dev: [torch.randn(X, device=dev).half(), torch.randn(X, device=dev)]),
    # ---- layouts: views, non-contiguous, broadcast, empty, size-1, 0-dim -------------------------
    C("noncontig_in", lambda a, b: a * 2 + b, gen(("nc", X), X), LOWP),
    C("transpose_out", lambda a: (a + 1).t(), g1, strides=False), C("permute3", lambda a: a.permute(2, 0, 1).contiguous() * 2, gen(X3)),
    C("expand_add", lambda a, b: a.expand(4, 13, 37) + b, gen(X, (4, 1, 1))),
    C("slice_step", lambda a: a[1:12:3, 2:30:5].exp(), g1), C("select_narrow", lambda a: a[3] + a.narrow(0, 2, 1), g1),
    C("reshape_chain", lambda a: (a.view(37, 13) * 2).reshape(-1, 37).sum(0), g1),
    C("unsqueeze_squeeze", lambda a: a.unsqueeze(1).squeeze(1) + a[:, None, :].sum(1), g1),
    C("flip", lambda a: a.flip(0) + a.flip(1), g1), C("roll", lambda a: torch.roll(a, 3, 1), g1),
    C("repeat", lambda a: a[:3, :5].repeat(2, 3), g1), C("diagonal", lambda a: torch.diagonal(a[:, :13]) * 2, g1),
    C("split_chunk", lambda a: [t * i for i, t in enumerate(torch.split(a, 5, 1))] + list(torch.chunk(a, 3, 0)), g1,
      strides=False),
    C("empty", lambda a: (a + 1, a.sum(0), a.sum(1)), gen((0, 5))), C("size1", lambda a: (a * 2, a.sum(), a.amax(0)), gen((1, 1))),
    C("scalar0d", lambda a, b: a * b + 1, gen((), X)), C("size1_dims", lambda a: a.sum(1) + a.mean(0), gen((1, 37, 1))),
    C("view_output", lambda a: (a.view(-1), a[2:5]), g1, strides=False),
    # ---- reductions over each dim ------------------------------------------------------------
    C("sum_d0", lambda a: a.sum(0), gen(X3), LOWP, looped=True), C("sum_d1", lambda a: a.sum(1), gen(X3), LOWP, looped=True),
    C("sum_d2", lambda a: a.sum(2), gen(X3), LOWP, looped=True), C("sum_d02", lambda a: a.sum((0, 2)), gen(X3), looped=True),
    C("sum_all", lambda a: a.sum(), gen(X3), LOWP, looped=True), C("sum_keepdim", lambda a: a.sum(1, keepdim=True), gen(X3)),
    C("mean", lambda a: (a.mean(0), a.mean(-1)), gen(X3), LOWP, looped=True),
    C("amax_amin", lambda a: (a.amax(1), a.amin(0)), gen(X3), LOWP, looped=True),
    C("max_dim", lambda a: a.max(1), gen(X3), looped=True), C("min_dim", lambda a: a.min(0), gen(X3), looped=True),
    C("argmax", lambda a: (a.argmax(0), a.argmax(2), a.argmax()), gen(X3), looped=True),
    C("argmin", lambda a: (a.argmin(1), a.argmin()), gen(X3), looped=True),
    C("argmax_ties", lambda a: (a.round().argmax(1), a.round().argmin(0)), gen(X), looped=True),
    C("amax_nan", lambda a: (a.amax(1), a.argmax(1)), gen(("special", X)), looped=True),
    C("prod", lambda a: a.prod(1), gen(("pos", (9, 11))), rtol=1e-4, looped=True),
    C("var_std", lambda a: (a.var(1), a.std(0), torch.var(a, 1, correction=0)), gen(X), rtol=1e-4, looped=True),
    C("var_mean", lambda a: torch.var_mean(a, 0), gen(X3), rtol=1e-4),
    C("any_all", lambda a: (a.any(1), a.all(0), (a > 0).all()), gen(("bool", X)), looped=True),
    C("sum_int", lambda a: (a.sum(1), a.sum()), gen(("int", X, -9, 9)), looped=True),
    C("sum_bool", lambda a: a.sum(0), gen(("bool", X))),
    C("logsumexp", lambda a: torch.logsumexp(a, 1), g1, rtol=1e-4, looped=True),
    C("norm", lambda a: torch.linalg.vector_norm(a, dim=1), g1, rtol=1e-4, looped=True),
    C("sum_noncontig", lambda a: a.sum(1), gen(("nc", X)), looped=True),
    C("sum_large_r", lambda a: a.sum(1), gen((3, 3000)), atol=1e-4, rtol=1e-4),
    # ---- fused patterns ----------------------------------------------------------------------
    C("softmax", lambda a: torch.softmax(a, -1), g1, LOWP, kernels=1, looped=True),
    C("softmax_dim0", lambda a: torch.softmax(a, 0), g1, kernels=1, looped=True),
    C("softmax_mid", lambda a: torch.softmax(a, 1), gen(X3), looped=True),
    C("log_softmax", lambda a: F.log_softmax(a, -1), g1, LOWP, kernels=1, looped=True),
    C("layer_norm", lambda a, w, b: F.layer_norm(a, (37,), w, b), gen(X, (37,), (37,)), LOWP, rtol=1e-4, atol=1e-5,
      kernels=1, looped=True),
    C("rms_norm", lambda a, w: F.rms_norm(a, (37,), w, eps=1e-6), gen(X, (37,)), LOWP, rtol=1e-4, kernels=1, looped=True),
    C("group_norm", lambda a, w, b: F.group_norm(a, 2, w, b), gen((3, 4, 5, 5), (4,), (4,)), rtol=1e-4, atol=1e-5),
    C("batch_norm_eval", lambda a, m, v, w, b: F.batch_norm(a, m, v.abs(), w, b), gen((6, 4, 5), (4,), (4,), (4,), (4,)),
      rtol=1e-4),
    C("batch_norm_train", lambda a, w, b: F.batch_norm(a, None, None, w, b, training=True), gen((6, 4, 5), (4,), (4,)),
      rtol=1e-4, atol=1e-5),
    C("cross_entropy", lambda a, t: F.cross_entropy(a, t), gen(X, ("int", (13,), 0, 37)), rtol=1e-4, kernels=1, looped=True),
    # batch 1: the target's index is a scalar load, the logit it picks a scalar address under xmask
    C("cross_entropy_batch1", lambda a, t: F.cross_entropy(a, t), gen((1, 37), ("int", (1,), 0, 37)), rtol=1e-4),
    C("cross_entropy_none", lambda a, t: F.cross_entropy(a, t, reduction="none"), gen(X, ("int", (13,), 0, 37)), rtol=1e-4),
    C("nll_ignore", lambda a, t: F.nll_loss(F.log_softmax(a, 1), t.masked_fill(t < 5, -100)), gen(X, ("int", (13,), 0, 37)),
      rtol=1e-4),
    C("mse_loss", lambda a, b: F.mse_loss(a, b), gen(X, X), rtol=1e-4),
    C("gelu_linear", lambda x, w, b: F.gelu(x @ w + b), gen((13, 24), (24, 19), (19,)), rtol=1e-4, atol=1e-5,
      kernels=1, externs=1),
    C("linear_relu", lambda x, w, b: torch.relu(F.linear(x, w, b)), gen((13, 24), (19, 24), (19,)), atol=1e-5, rtol=1e-4),
    C("mlp", lambda x, w1, w2: torch.tanh(x @ w1) @ w2, gen((13, 24), (24, 19), (19, 7)), atol=1e-5, rtol=1e-4),
    C("attention_math", lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v,
      gen((2, 9, 16), (2, 11, 16), (2, 11, 16)), atol=1e-5, rtol=1e-4),
    C("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), gen((1, 2, 9, 16), (1, 2, 11, 16), (1, 2, 11, 16)),
      atol=1e-5, rtol=1e-4, strides=False, externs=1),  # the flash kernel; its layout differs from eager's
    C("sdpa_causal_lowp", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2,
      gen((1, 2, 16, 16), (1, 2, 16, 16), (1, 2, 16, 16)), (f16, bf16), strides=False, externs=1),
    C("conv_relu", lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1)), gen((2, 3, 7, 7), (4, 3, 3, 3), (4,)),
      atol=1e-5, rtol=1e-4, kernels=1, externs=1),
    C("l2_normalize", lambda a: F.normalize(a, dim=1), g1, rtol=1e-4),
    C("cosine_sim", lambda a, b: F.cosine_similarity(a, b, dim=1), gen(X, X), rtol=1e-4),
    C("residual_ln", lambda x, y, w: F.layer_norm(x + y, (37,), w) * 2, gen(X, X, (37,)), rtol=1e-4, atol=1e-5),
    C("bias_gelu_dropout0", lambda x, b: F.dropout(F.gelu(x + b), 0.0), gen(X, (37,))),
    C("softmax_large_r", lambda a: torch.softmax(a, -1), gen((3, 1500)), rtol=1e-4, kernels=1),
    # ---- indexing, concatenation, creation, extern fallbacks -----------------------------------
    C("cat", lambda a, b: torch.cat([a, b * 2, a[:, :3]], 1), gen(X, X)), C("cat_dim0", lambda a, b: torch.cat([a, b]), gen(X, (2, 37))),
    C("stack", lambda a, b: torch.stack([a, b], 1), gen(X, X)),
    C("pad", lambda a: F.pad(a, (2, 3, 1, 0), value=0.5), g1), C("pad_negative", lambda a: F.pad(a, (-2, 1)), g1),
    # a load at one fixed address under the pad's block mask (falcon on H100: Triton rejected it)
    C("pad_of_broadcast_scalar", lambda s, a: (F.pad(s.expand(37), (1, 2)) + a, F.pad(s.expand(13, 37), (1, 2)).sum(1)),
      gen((1,), (40,)), looped=True),
    C("tril_triu", lambda a: (torch.tril(a), torch.triu(a, 1)), gen((9, 9))),
    C("embedding", lambda w, i: F.embedding(i, w), gen((20, 8), ("int", (4, 5), 0, 20))),
    C("index_select", lambda w, i: w.index_select(1, i), gen((6, 20), ("int", (7,), 0, 20))),
    C("gather", lambda w, i: torch.gather(w, 1, i), gen((6, 20), ("int", (6, 4), 0, 20))),
    C("index_adv", lambda w, i, j: (w[i], w[:, j], w[i, j]), gen((6, 20), ("int", (3,), -6, 6), ("int", (3,), 0, 20))),
    # positions gathered from a padded / concatenated / created value: its bounds mask (or its value)
    # reads the gathered position, which exists only inside the gathering load (convbert's unfold:
    # pad, then index with arange windows; wrapped like Python's negative indices)
    C("index_of_pad", lambda x, j: (F.pad(x, (0, 0, 4, 4))[:, torch.arange(x.shape[1], device=x.device)[:, None]
                                                         + torch.arange(9, device=x.device)] * 2,
                                    F.pad(x, (0, 0, 2, 1), value=0.5)[:, j].sum(-1),
                                    torch.cat([x, x * 2], 1)[:, j, 1:],
                                    torch.arange(x.shape[1] + 3, device=x.device)[j] + 1),
      gen((2, 11, 5), ("int", (3, 4), -11, 11)), looped=True),
    C("slice_scatter", lambda a, b: torch.slice_scatter(a, b, 1, 2, 30, 4), gen(X, (13, 7))),
    C("scatter_one", lambda a, i: (torch.scatter(a, 1, i, -2.0), torch.scatter(a, 1, i, a[:, :1] * 3)),
      gen(X, ("int", (13, 1), 0, 37))),
    C("select_scatter", lambda a, b: torch.select_scatter(a, b, 0, 3), gen(X, (37,))),
    C("size1_index_math", lambda a, b: (torch.cat([a, b], 0), torch.select_scatter(a, b[:, 0], 1, 0), torch.arange(1, device=a.device) + a),
      gen((1, 3), (1, 3))),
    C("arange_ops", lambda a: a + torch.arange(37, device=a.device) * 0.5, g1),
    C("full_like", lambda a: (torch.zeros_like(a) + 1, torch.full_like(a, 3.0) * a, torch.ones(3, 4, device=a.device)), g1),
    C("cumsum_extern", lambda a: torch.cumsum(a * 2, 1) + 1, g1, atol=1e-5, rtol=1e-5),
    C("sort_extern", lambda a: torch.sort(a, 1).values * 2, g1),
    C("topk_extern", lambda a: torch.topk(a, 3).values + 1, g1),
    C("scatter_extern", lambda a, i: torch.scatter(a, 1, i, -2.0), gen(X, ("int", (13, 3), 0, 37))),
    C("inplace_ops", lambda a: a.clone().mul_(2).add_(1).relu_(), g1),
    C("input_mutation", lambda a: a.add_(1.5), g1),
    C("multi_output_shared", lambda a: (a.exp(), a.exp() * 2, a.sum(1), a.exp().sum(1)), g1),
    # ---- non-default arguments: a lowering (or decomposition) that ignores an argument must fail ----
    C("leaky_relu_slope", lambda x: (F.leaky_relu(x, 0.2), F.leaky_relu(x, -0.3), F.leaky_relu(x, 1.5)), g1),
    C("elu_alpha", lambda x: F.elu(x, alpha=0.5), g1, rtol=1e-4),
    C("elu_scales", lambda x: torch.ops.aten.elu(x, 0.5, 2.0, 1.5), g1, rtol=1e-4),  # alpha, scale, input_scale
    C("elu_input_scale_only", lambda x: torch.ops.aten.elu(x, 1.0, 1.0, 0.25), g1, rtol=1e-4),
    C("selu", F.selu, g1, rtol=1e-4), C("celu", lambda x: F.celu(x, alpha=0.7), g1, rtol=1e-4),
    C("hardtanh_bounds", lambda x: (F.hardtanh(x, -0.3, 0.6), F.hardtanh(x, min_val=-0.2), F.hardtanh(x, max_val=0.4)), g1),
    C("relu6", lambda x: F.relu6(x * 4), g1),
    C("softplus_args", lambda x: (F.softplus(x, beta=2.0, threshold=1.5), F.softplus(x * 4, beta=0.5, threshold=3.0)), g1,
      rtol=1e-4),
    C("threshold", lambda x: F.threshold(x, 0.1, 20.0), g1),
    C("shrink", lambda x: (F.hardshrink(x, 0.3), F.softshrink(x, 0.4)), g1),
    C("nan_to_num_nan", lambda x: (torch.nan_to_num(x, nan=1.5), torch.nan_to_num(x, 2.0, 3.0, -4.0)), gen(("special", X))),
    C("clamp_one_side", lambda x: (x.clamp(max=0.3), x.clamp_max(-0.2), x.clamp(min=-0.1)), g1),
    C("clamp_tensor", lambda x, lo, hi: (torch.clamp(x, lo, hi), torch.clamp(x, max=hi), x.clamp_min(lo)), gen(X, X, (37,))),
    C("clamp_crossed", lambda x: x.clamp(0.5, -0.5), g1),  # min > max: everything becomes max
    C("round_decimals", lambda x: (torch.round(x * 10, decimals=2), torch.round(x * 100, decimals=-1)), g1),
    C("pow_neg2", lambda a: a ** -2, pos, rtol=1e-4), C("pow_neg_half", lambda a: a ** -0.5, pos),
    C("pow0_pow1", lambda a: (a ** 0, a ** 1, a ** 2.0), g1), C("pow_scalar_base", lambda a: 2 ** a, g1, rtol=1e-4),
    C("pow_int", lambda a: (a ** 2, a ** 3), gen(("int", X, -9, 9))),
    C("div_modes_float", lambda a, b: (torch.div(a * 5, b, rounding_mode="trunc"), torch.div(a * 5, b, rounding_mode="floor"),
                                       torch.div(a * 5, 2.5, rounding_mode="trunc")), gen(X, ("pos", X))),
    C("sub_alpha", lambda a, b: (torch.sub(a, b, alpha=0.5), torch.rsub(a, b, alpha=2), torch.add(a, 3.0, alpha=-2)),
      gen(X, X)),
    C("lerp_tensor_weight", lambda a, b, w: torch.lerp(a, b, w), gen(X, X, ("unit", X))),
    C("addcdiv_value", lambda a, b, c: torch.addcdiv(a, b, c, value=-0.7), gen(X, X, ("pos", X)), rtol=1e-4),
    C("layer_norm_eps", lambda a, w, b: F.layer_norm(a, (37,), w, b, eps=0.5), gen(X, (37,), (37,)), rtol=1e-4, atol=1e-5),
    C("rms_norm_eps", lambda a, w: F.rms_norm(a, (37,), w, eps=0.5), gen(X, (37,)), rtol=1e-4),
    C("group_norm_eps", lambda a, w, b: F.group_norm(a, 4, w, b, eps=0.5), gen((3, 4, 5, 5), (4,), (4,)), rtol=1e-4, atol=1e-5),
    C("batch_norm_eval_eps", lambda a, m, v: F.batch_norm(a, m, v.abs(), eps=0.5), gen((6, 4, 5), (4,), (4,)), rtol=1e-4),
    C("batch_norm_train_stats", lambda a, m, v: (F.batch_norm(a, m, v, training=True, momentum=0.3, eps=0.5), m + 0, v + 0),
      gen((6, 4, 5), (4,), ("pos", (4,))), rtol=1e-4, atol=1e-5),
    C("cross_entropy_args", lambda a, t, w: (F.cross_entropy(a, t, w, ignore_index=3, label_smoothing=0.1),
                                             F.cross_entropy(a, t, reduction="sum", label_smoothing=0.2)),
      gen(X, ("int", (13,), 0, 37), ("pos", (37,))), rtol=1e-4),
    C("nll_weight_sum", lambda a, t, w: F.nll_loss(F.log_softmax(a, 1), t, w, reduction="sum"),
      gen(X, ("int", (13,), 0, 37), ("pos", (37,))), rtol=1e-4),
    C("mse_loss_reductions", lambda a, b: (F.mse_loss(a, b, reduction="sum"), F.mse_loss(a, b, reduction="none")),
      gen(X, X), rtol=1e-4),
    C("normalize_args", lambda a, b: (F.normalize(a, p=1.0, dim=0), F.normalize(a * 1e-3, dim=1, eps=0.5),
                                      F.cosine_similarity(a, b, dim=0, eps=0.5)), gen(X, X), rtol=1e-4),
    C("dropout_eval", lambda x: F.dropout(x, 0.5, training=False) * 2, g1),
    C("linear_no_bias", lambda x, w: torch.relu(F.linear(x, w)), gen((13, 24), (19, 24)), atol=1e-5, rtol=1e-4),
    C("conv_args", lambda x, w: F.conv2d(x, w, None, stride=2, padding=2, dilation=2, groups=2) * 2,
      gen((2, 4, 9, 9), (6, 2, 3, 3)), atol=1e-5, rtol=1e-4, externs=1),
    C("sdpa_scale_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
      gen((1, 2, 9, 16), (1, 2, 11, 16), (1, 2, 11, 16), (9, 11)), atol=1e-5, rtol=1e-4, strides=False),
    C("softmax_dtype", lambda a: (torch.softmax(a, 0, dtype=torch.float64), F.log_softmax(a, 1, dtype=torch.float64)), g1),
    C("pad_modes", lambda a: (F.pad(a[None], (2, 1), mode="reflect"), F.pad(a[None], (3, 2), mode="replicate"),
                              F.pad(a[None], (1, 2, 2, 0), value=-3.0)), g1),
    C("tril_triu_diag", lambda a: (torch.tril(a, -2), torch.triu(a, -1), torch.tril(a, 3)), gen((9, 9))),
    C("roll_flip_args", lambda a: (torch.roll(a, (-2, 5), (0, 1)), torch.roll(a, 4), a.flip(-1)), g1),
    C("diagonal_args", lambda a: (torch.diagonal(a[:, :13], offset=2), torch.diagonal(a[:, :13], -3),
                                  torch.diagonal(a.view(13, 1, 37), 0, 0, 2)), g1),
    C("split_sizes", lambda a: [t * (i + 1) for i, t in enumerate(torch.split(a, [5, 20, 12], 1))], g1, strides=False),
    C("stack_cat_neg_dim", lambda a, b: (torch.stack([a, b], -1), torch.cat([a, b], -2)), gen(X, X)),
    C("index_dim0", lambda w, i: (w.index_select(0, i), torch.gather(w, 0, i[None].expand(3, 7)), F.embedding(i, w, padding_idx=2)),
      gen((6, 20), ("int", (7,), 0, 6))),
    C("scatter_neg_slices", lambda a, b, c: (torch.slice_scatter(a, b, 1, -30, None, 3), torch.select_scatter(a, c, 1, -1)),
      gen(X, (13, 10), (13,))),
    C("arange_args", lambda a: (a + torch.arange(2, 76, 2, device=a.device), torch.arange(0.5, 19, 0.5, device=a.device) * 2,
                                torch.arange(37, 0, -1, device=a.device)), g1),
    C("extern_args", lambda a: (torch.cumsum(a, 0) * 2, torch.sort(a, 0, descending=True).values + 1,
                                torch.topk(a, 3, dim=0, largest=False).values * 2), g1, atol=1e-5, rtol=1e-5),
    C("reduce_args", lambda a: (a.sum(1, dtype=torch.float64), a.mean((0, 2), keepdim=True), a.prod(2, keepdim=True),
                                a.amax((0, 1), keepdim=True), a.argmax(1, keepdim=True), a.max(0, keepdim=True).values,
                                torch.logsumexp(a, 0, keepdim=True), a.any(2, keepdim=True)), gen(X3), rtol=1e-4, looped=True),
    C("var_std_args", lambda a: (a.std(0, correction=2), torch.var(a, 1, unbiased=False, keepdim=True),
                                 torch.var_mean(a, (0, 1), correction=0), torch.std(a)), gen(X3), rtol=1e-4, looped=True),
    C("norm_ords", lambda a: (torch.linalg.vector_norm(a, 1, dim=1), torch.linalg.vector_norm(a, float("inf"), dim=0),
                              torch.linalg.vector_norm(a, 3.0)), g1, rtol=1e-4),
    # ---- max pooling (lower_pool.py): windows with padding, ceil_mode, stride 1; NaN, -inf and ties ----
    C("max_pool2d", lambda x: (F.max_pool2d(x, 2), F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
                               F.max_pool2d(x, (3, 2), (1, 2), (1, 0), return_indices=True)),
      lambda dt, dev: [_pool_input(dt, dev)], dtypes=LOWP),
    C("max_pool2d_of_bn_relu", lambda x, m, v: F.max_pool2d(F.relu(F.batch_norm(x, m, v.abs() + 0.1)), 2, return_indices=True),
      gen((2, 4, 9, 11), (4,), (4,)), rtol=1e-4, atol=1e-5),
    C("max_pool2d_chlast_3d", lambda x, y: (F.max_pool2d(x, 3, 2, ceil_mode=True), F.max_pool2d(y, 2, 1, return_indices=True)),
      lambda dt, dev: [torch.randn(2, 3, 9, 8, device=dev).to(dt).to(memory_format=torch.channels_last),
                       torch.randn(3, 7, 5, device=dev).to(dt)]),
    # ---- max pooling backward (lower_pool.py): gather form, eager's indices decide (ties from integer-valued
    # inputs, NaN, -inf planes); overlapping, ceil_mode, stride > kernel, channels-last, no batch dim ----
    C("max_pool2d_bwd", lambda g1, x1, i1, g2, x2, i2, g3, x3, i3: (
        aten.max_pool2d_with_indices_backward(g1, x1, [3, 3], [2, 2], [1, 1], [1, 1], False, i1),
        aten.max_pool2d_with_indices_backward(g2, x2, [3, 2], [1, 2], [1, 0], [1, 1], True, i2),
        aten.max_pool2d_with_indices_backward(g3, x3, [2, 2], [3, 3], [0, 0], [1, 1], False, i3)),
      lambda dt, dev: (_pool_bwd_inputs(_pool_input(dt, dev), 3, 2, 1)
                       + _pool_bwd_inputs(_pool_ties(dt, dev), (3, 2), (1, 2), (1, 0), ceil_mode=True)
                       + _pool_bwd_inputs(_pool_ties(dt, dev), 2, 3, 0)),
      dtypes=LOWP, externs=0),
    C("max_pool2d_bwd_chlast_3d", lambda g1, x1, i1, g2, x2, i2: (
        aten.max_pool2d_with_indices_backward(g1, x1, [3, 3], [2, 2], [1, 1], [1, 1], False, i1),
        aten.max_pool2d_with_indices_backward(g2, x2, [3, 3], [1, 1], [1, 1], [1, 1], True, i2)),
      lambda dt, dev: (_pool_bwd_inputs(_pool_ties(dt, dev).to(memory_format=torch.channels_last), 3, 2, 1)
                       + _pool_bwd_inputs(_pool_ties(dt, dev)[0], 3, 1, 1, ceil_mode=True)),
      externs=0),
    C("empty_reductions", lambda a: (a.prod(0), a.prod(), a.any(0), a.all(0), a.sum(0, keepdim=True), a.mean(0)), gen((0, 5))),
]

assert len({c.name for c in OPS}) == len(OPS), "duplicate case names"
