"""Lowerings of computing ops: pointwise math (declared in the op registry, ``ops.py``), casts,
constants, reductions, indexing, cat/pad, and the ops kept as extern ATen calls on purpose (matmul,
convolution, attention).

Pointwise ops follow eager's type promotion: arguments are cast to the computation dtype that
``torch._prims_common.elementwise_dtypes`` gives (fp32 for fp16/bf16), the op runs, and the result is
cast to the node's dtype, i.e. rounded like eager rounds every op's result.
"""
from __future__ import annotations

import math

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes

from ember.native import ir, ops
from ember.native.lower_views import reshape_value
from ember.native.symbolic import SymbolicUnsupported, eq, is_static, norm
from ember.native.lowering import (EXTERN_ALIGN, Decline, Lazy, Unsupported, Value, broadcast_loader, out_meta,
                                   register, register_extern)

aten = torch.ops.aten
prims = torch.ops.prims
Z = sympy.Integer(0)

register_extern(
    aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
    aten._addmm_activation.default,  # (cpu_mm.py's rewrite on the C++ path)
    aten.convolution.default, aten.convolution_backward.default,
    aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
)
# Memory-efficient attention reads its bias with 16-byte vector loads and checks that the batch, head
# and row strides are multiples of 8 fp16/bf16 (4 fp32) elements; eager's sdpa pads the bias's rows
# before the call, so a bias computed here gets padded rows too (wav2vec2, hubert: 79 x 79 masks).
EXTERN_ALIGN.update({
    aten._scaled_dot_product_efficient_attention.default: {"attn_bias": 8},
    aten._scaled_dot_product_efficient_attention_backward.default: {"attn_bias": 8},
})


_out = out_meta


def _proto(a):
    """A stand-in with a's dtype and rank class for elementwise_dtypes (0-dim tensors promote
    differently from others)."""
    if isinstance(a, Value):
        return torch.empty((1,) * len(a.sizes) if a.sizes else (), dtype=a.dtype, device="meta")
    if isinstance(a, sympy.Basic):
        return 1  # a symbolic size: an int
    return a


_DTYPES: dict = {}  # (promotion kind, each argument's promotion class) -> the dtype computed in


def _promotion_class(a):
    """What of ``a`` type promotion looks at: a tensor's dtype and whether it has dimensions, a
    Python number's type (never its value); a size expression is an int."""
    if isinstance(a, Value):
        return a.dtype, bool(a.sizes)
    if isinstance(a, torch.Tensor):
        return a.dtype, a.dim() > 0
    if isinstance(a, sympy.Basic):
        return int
    return type(a)


def compute_dtype(args, kind=KIND.DEFAULT):
    """The dtype ``kind``'s promotion of ``args`` computes in, memoized per argument classes: building
    meta-tensor stand-ins and promoting them for every pointwise node took ~0.5 s of a 24-layer
    Llama's training compile on the H100 host (sampled), for a handful of distinct answers."""
    key = (kind, *map(_promotion_class, args))
    dtype = _DTYPES.get(key)
    if dtype is None:
        dtype = _DTYPES[key] = elementwise_dtypes(*[_proto(a) for a in args], type_promotion_kind=kind)[0]
    return dtype


def pointwise(node, fn, args, kind=KIND.DEFAULT, compute=None):
    """Lazy value computing ``fn(*exprs)`` per element, args broadcast to the node's shape."""
    out = _out(node)
    sizes, out_dtype = tuple(out.shape), out.dtype
    compute = compute or compute_dtype(args, kind)
    loaders = [broadcast_loader(a, sizes) if isinstance(a, Value) else None for a in args]
    device = next((a.device for a in args if isinstance(a, Value)), out.device)

    def load(idx):
        es = [ir.cast(a.load(r(idx)), compute) if r else ir.const(a, compute) for a, r in zip(args, loaders)]
        return ir.cast(fn(*es), out_dtype)
    return Lazy(sizes, out_dtype, device, load)


# --------------------------------------------------------------------------------------------------
# pointwise ops: the lowerings the op registry (ops.py) declares


class PointwiseLowering:
    """What a registry lowering (``ops.Op.aten``) sees of the call it lowers: the target, the
    output's metadata, and ``pointwise`` to build the value."""
    __slots__ = ("node", "target", "out")

    def __init__(self, node):
        self.node, self.target, self.out = node, node.target, _out(node)

    def pointwise(self, fn, args, kind=KIND.DEFAULT, *, raw=False, const_dtypes=None):
        """``fn(*exprs)`` per element, args broadcast; ``raw``: operands are loaded in their own
        dtype (fn casts them), Python numbers become constants of ``const_dtypes``."""
        if not raw:
            return pointwise(self.node, fn, args, kind)
        out = self.out
        loaders = [broadcast_loader(v, out.shape) if isinstance(v, Value) else None for v in args]

        def load(idx):
            es = [v.load(r(idx)) if r else ir.const(v, dt) for v, r, dt in zip(args, loaders, const_dtypes)]
            return ir.cast(fn(*es), out.dtype)
        return Lazy(out.shape, out.dtype, out.device, load)

    compute_dtype = staticmethod(compute_dtype)

    @staticmethod
    def decline():
        raise Decline


def _register_registry():
    for target, lower in ops.ATEN.items():
        def lowering(L, node, *args, _lower=lower, **kwargs):
            return _lower(PointwiseLowering(node), *args, **kwargs)
        register(target)(lowering)


_register_registry()


# --------------------------------------------------------------------------------------------------
# casts, copies, constants


@register(aten._to_copy.default, aten.clone.default, prims.convert_element_type.default, aten.to.dtype)
def to_copy(L, node, x, *args, **kwargs):
    out = _out(node)
    if out.device != x.device or out.layout != torch.strided:
        raise Decline
    return Lazy(out.shape, out.dtype, x.device, lambda idx: ir.cast(x.load(idx), out.dtype))


@register(aten.copy.default)
def copy(L, node, dst, src, non_blocking=False):
    out = _out(node)
    if isinstance(src, Value) and src.device != dst.device:
        raise Decline
    r = broadcast_loader(src, out.shape)
    return Lazy(out.shape, out.dtype, dst.device, lambda idx: ir.cast(src.load(r(idx)), out.dtype))


def _fill(node, value):
    out = _out(node)
    return Lazy(out.shape, out.dtype, out.device, lambda idx: ir.const(value, out.dtype))


@register(aten.full.default, aten.full_like.default, aten.new_full.default)
def full(L, node, a, value, *args, **kwargs):
    return _fill(node, value)


@register(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
          aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default,
          aten.new_empty_strided.default)
def zeros(L, node, *args, **kwargs):
    return _fill(node, 0)  # empty values are unspecified: zeros are as good as any


@register(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(L, node, *args, **kwargs):
    return _fill(node, 1)


@register(aten.scalar_tensor.default)
def scalar_tensor(L, node, value, **kwargs):
    return _fill(node, value)


@register(aten.fill.Scalar, aten.fill.Tensor)
def fill(L, node, x, value):
    if isinstance(value, Value):
        out = _out(node)
        return Lazy(out.shape, out.dtype, out.device, lambda idx: ir.cast(value.load([Z] * len(value.sizes)), out.dtype))
    return _fill(node, value)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start, prims.iota.default)
def arange(L, node, *args, **kwargs):
    out = _out(node)
    if node.target is prims.iota.default:
        start, step = kwargs["start"], kwargs["step"]
    else:
        nums = [a for a in args if isinstance(a, (int, float, sympy.Basic))]
        start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) > 2 else 1)

    def load(idx):
        if out.dtype.is_floating_point:
            i = ir.cast(ir.index_value(idx[0]), torch.float64)
            return ir.cast(ir.op("add", ir.op("mul", i, ir.const(step, torch.float64)), ir.const(start, torch.float64)), out.dtype)
        return ir.cast(ir.index_value(start + step * idx[0]), out.dtype)
    return Lazy(out.shape, out.dtype, out.device, load)


# --------------------------------------------------------------------------------------------------
# reductions


def _acc_dtype(dtype):
    if dtype.is_floating_point:
        return torch.float64 if dtype == torch.float64 else torch.float32
    return torch.int64


def _dims(x, dims):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(len(x.sizes)))
    return [dims] if isinstance(dims, int) else list(dims)


@register(aten.sum.dim_IntList, aten.sum.default, prims.sum.default)
def sum_(L, node, x, dims=None, keepdim=False, dtype=None, **kw):
    out = _out(node)
    return L.reduce(x, _dims(x, dims), keepdim, "sum", out.dtype, _acc_dtype(out.dtype),
                    body_fn=lambda e: ir.cast(e, out.dtype) if not out.dtype.is_floating_point else e)


@register(aten.mean.dim, aten.mean.default)
def mean(L, node, x, dims=None, keepdim=False, dtype=None):
    out = _out(node)
    dims = _dims(x, dims)
    n = math.prod(x.sizes[d] for d in dims) if x.sizes else 1
    acc = _acc_dtype(out.dtype)
    s = L.reduce(x, dims, keepdim, "sum", acc, acc)
    return Lazy(s.sizes, out.dtype, x.device,
                lambda idx: ir.cast(ir.op("truediv", s.load(idx), ir.const(n, acc)), out.dtype))


@register(aten.prod.default, aten.prod.dim_int)
def prod(L, node, x, dim=None, keepdim=False, dtype=None):
    out = _out(node)
    return L.reduce(x, _dims(x, dim), keepdim, "prod", out.dtype, _acc_dtype(out.dtype),
                    body_fn=lambda e: ir.cast(e, out.dtype) if not out.dtype.is_floating_point else e)


@register(aten.amax.default, aten.amin.default, aten.max.default, aten.min.default)
def amax(L, node, x, dims=None, keepdim=False):
    out = _out(node)
    rtype = "max" if node.target in (aten.amax.default, aten.max.default) else "min"
    return L.reduce(x, _dims(x, dims), keepdim, rtype, out.dtype, _acc_dtype(out.dtype) if out.dtype.is_floating_point else out.dtype)


@register(aten.max.dim, aten.min.dim)
def max_dim(L, node, x, dim, keepdim=False):
    out = node.meta["val"][0]
    kind = "max" if node.target is aten.max.dim else "min"
    acc = _acc_dtype(out.dtype) if out.dtype.is_floating_point else out.dtype
    values = L.reduce(x, [dim], keepdim, kind, out.dtype, acc)
    indices = L.reduce(x, [dim], keepdim, "arg" + kind, torch.int64)
    return [values, indices]


@register(aten.argmax.default, aten.argmin.default)
def argmax(L, node, x, dim=None, keepdim=False):
    kind = "argmax" if node.target is aten.argmax.default else "argmin"
    if dim is None:
        res = L.reduce(x, list(range(len(x.sizes))), keepdim, kind, torch.int64)
        return res
    return L.reduce(x, [dim], keepdim, kind, torch.int64)


@register(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def any_(L, node, x, dims=None, keepdim=False):
    kind = "any" if node.target in (aten.any.default, aten.any.dim, aten.any.dims) else "all"
    return L.reduce(x, _dims(x, dims), keepdim, kind, torch.bool)


def _var_mean(L, node, x, dims, correction, keepdim, out_dtype):
    """Two passes (mean, then the sum of squared deviations): numerically close to eager's
    Welford, and both passes fuse into one kernel."""
    dims = _dims(x, dims)
    n = math.prod(x.sizes[d] for d in dims) if x.sizes else 1
    acc = _acc_dtype(out_dtype)
    total = L.reduce(x, dims, True, "sum", acc, acc)
    mean_k = Lazy(total.sizes, acc, x.device, lambda idx: ir.op("truediv", total.load(idx), ir.const(n, acc)))
    bl = broadcast_loader(mean_k, x.sizes)
    xc = Lazy(x.sizes, acc, x.device, lambda idx: ir.op("sub", ir.cast(x.load(idx), acc), mean_k.load(bl(idx))))
    sq = L.reduce(xc, dims, keepdim, "sum", acc, acc, body_fn=lambda e: ir.op("mul", e, e))
    c = 1 if correction is None else correction
    if is_static(n):
        denom = ir.const(max(n - c, 0), acc)
    else:  # computed in the kernel from the size, clamped at 0 like eager (n <= correction: inf/nan)
        denom = ir.op("maximum", ir.op("sub", ir.const(n, acc), ir.const(c, acc)), ir.const(0, acc))
    var = Lazy(sq.sizes, out_dtype, x.device,
               lambda idx: ir.cast(ir.op("truediv", sq.load(idx), denom), out_dtype))
    m = mean_k if keepdim else reshape_value(mean_k, sq.sizes)
    mean = Lazy(m.sizes, out_dtype, x.device, lambda idx: ir.cast(m.load(idx), out_dtype))
    return var, mean


@register(aten.var.correction, aten.var_mean.correction, prims.var.default, aten.std.correction)
def var(L, node, x, dims=None, *, correction=None, keepdim=False, output_dtype=None):
    if node.target is prims.var.default:
        correction = node.args[2] if len(node.args) > 2 else node.kwargs.get("correction")
    meta = node.meta["val"]
    out_dtype = (meta[0] if isinstance(meta, (list, tuple)) else meta).dtype
    v, m = _var_mean(L, node, x, dims, correction, keepdim, out_dtype)
    if node.target is aten.std.correction:
        return Lazy(v.sizes, out_dtype, x.device, lambda idx: ir.op("sqrt", v.load(idx)))
    return [v, m] if node.target is aten.var_mean.correction else v


# --------------------------------------------------------------------------------------------------
# indexing, cat, pad


def _wrap_index(L, e: ir.Expr, size: int):
    """An indirect index symbol for e, negative values wrapped like eager does."""
    e = ir.cast(e, torch.int64)
    e = ir.op("where", ir.op("lt", e, ir.const(0, torch.int64)), ir.op("add", e, ir.const(size, torch.int64)), e)
    return L.new_indirect(e)


@register(aten.gather.default)
def gather(L, node, x, dim, index, sparse_grad=False):
    d = dim % max(len(x.sizes), 1)
    out = _out(node)

    def load(idx):
        if not x.sizes:
            return x.load([])
        s = _wrap_index(L, index.load(idx), x.sizes[d])
        return x.load(idx[:d] + [s] + idx[d + 1:])
    return Lazy(out.shape, x.dtype, x.device, load)


@register(aten.index_select.default)
def index_select(L, node, x, dim, index):
    d = dim % max(len(x.sizes), 1)
    out = _out(node)

    def load(idx):
        i = index.load([idx[d]] if index.sizes else [])
        return x.load(idx[:d] + [_wrap_index(L, i, x.sizes[d])] + idx[d + 1:])
    return Lazy(out.shape, x.dtype, x.device, load)


@register(aten.embedding.default)
def embedding(L, node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    out = _out(node)
    k = len(indices.sizes)

    def load(idx):
        return weight.load([_wrap_index(L, indices.load(idx[:k]), weight.sizes[0])] + idx[k:])
    return Lazy(out.shape, weight.dtype, weight.device, load)


@register(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(L, node, x, indices):
    out = _out(node)
    pos = [i for i, t in enumerate(indices) if t is not None]
    if any(t.dtype == torch.bool for t in indices if t is not None):
        raise Decline  # boolean masks have data-dependent shapes
    bshape = _broadcast_shapes([indices[i].sizes for i in pos])
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    first = pos[0] if adjacent else 0
    nb = len(bshape)
    loaders = {i: broadcast_loader(indices[i], bshape) for i in pos}

    def load(idx):
        bidx = idx[first:first + nb]
        rest = idx[:first] + idx[first + nb:]
        it = iter(rest)
        full = []
        for d in range(len(x.sizes)):
            if d in loaders:
                full.append(_wrap_index(L, indices[d].load(loaders[d](bidx)), x.sizes[d]))
            else:
                full.append(next(it))
        return x.load(full)
    return Lazy(out.shape, x.dtype, x.device, load)


def _broadcast_shapes(shapes) -> list:
    """Right-aligned broadcast of shapes that tracing already checked (sizes may be symbolic)."""
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for shape in shapes:
        for i, size in enumerate(shape, n - len(shape)):
            if size != 1:
                out[i] = size
    return out


def _maybe_lt(a, b) -> bool:
    """Could a < b? (For symbolic sizes: unless provably equal; a mask too many is only slower.)"""
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return not eq(a, b)


@register(aten.cat.default)
def cat(L, node, tensors, dim=0):
    out = _out(node)
    n = len(out.shape)
    d = dim % n
    parts, offset = [], 0
    for t in tensors:
        if len(t.sizes) == 1 and t.sizes[0] == 0 and n != 1:
            continue  # legacy empty tensors take no part
        if t.sizes[d] != 0:
            parts.append((offset, t))
        offset = offset + t.sizes[d]

    def load(idx):
        i = ir.index_value(idx[d])
        result = None
        for start, t in reversed(parts):
            end = start + t.sizes[d]
            conds = ([ir.op("ge", i, ir.const(start, torch.int64))] if start != 0 else []) + \
                ([ir.op("lt", i, ir.const(end, torch.int64))] if _maybe_lt(end, out.shape[d]) else [])
            val = ir.cast(t.load(idx[:d] + [idx[d] - start] + idx[d + 1:]), out.dtype)
            if not conds:
                result = val
                continue
            inside = conds[0] if len(conds) == 1 else ir.op("logical_and", *conds)
            val = ir.masked(inside, val, 0)  # the other parts' rows must not load from t
            result = val if result is None else ir.op("where", inside, val, result)
        return result if result is not None else ir.const(0, out.dtype)
    return Lazy(out.shape, out.dtype, out.device, load)


@register(aten.constant_pad_nd.default)
def constant_pad_nd(L, node, x, pad, value=0):
    out = _out(node)
    n = len(out.shape)
    lows = {n - 1 - k // 2: pad[k] for k in range(0, len(pad), 2)}

    def load(idx):
        src = list(idx)
        conds = []
        for d, lo in lows.items():
            src[d] = idx[d] - lo
            if lo > 0:
                conds.append(ir.op("ge", ir.index_value(idx[d]), ir.const(lo, torch.int64)))
            if _maybe_lt(lo + x.sizes[d], out.shape[d]):
                conds.append(ir.op("lt", ir.index_value(idx[d]), ir.const(lo + x.sizes[d], torch.int64)))
        val = x.load(src)
        if not conds:
            return val
        mask = conds[0]
        for cnd in conds[1:]:
            mask = ir.op("logical_and", mask, cnd)
        return ir.op("where", mask, ir.masked(mask, val, 0), ir.const(value, out.dtype))
    return Lazy(out.shape, out.dtype, out.device, load)


@register(aten.slice_scatter.default)
def slice_scatter(L, node, x, src, dim=0, start=None, end=None, step=1):
    out = _out(node)
    d = dim % len(out.shape)
    size = out.shape[d]
    length = src.sizes[d]
    if is_static(size) and is_static(start or 0):
        start = 0 if start is None else (start + size if start < 0 else start)
    else:
        start = norm(start or 0)
        if isinstance(start, int) and start < 0:
            start = start + size
        if (step != 1 and not is_static(start)) or not L.sv.nonneg(start):
            raise SymbolicUnsupported(f"slice_scatter at {start} (step {step}) into a dimension of size {size}")

    def load(idx):
        i = ir.index_value(idx[d])
        inside = ir.op("logical_and", ir.op("ge", i, ir.const(start, torch.int64)),
                       ir.op("lt", i, ir.const(start + length * step, torch.int64)))
        if step != 1:
            inside = ir.op("logical_and", inside, ir.op(
                "eq", ir.index_value(ir.IMod(idx[d] + (step - start % step) % step, step)), ir.const(0, torch.int64)))
        inner = idx[:d] + [ir.FloorDiv(idx[d] - start, step) if step != 1 else idx[d] - start] + idx[d + 1:]
        return ir.op("where", inside, ir.masked(inside, ir.cast(src.load(inner), out.dtype), 0), x.load(idx))
    return Lazy(out.shape, out.dtype, out.device, load)


@register(aten.select_scatter.default)
def select_scatter(L, node, x, src, dim, index):
    out = _out(node)
    d = dim % len(out.shape)
    index = norm(index)
    if isinstance(index, int) and index < 0:
        index = index + out.shape[d]

    def load(idx):
        hit = ir.op("eq", ir.index_value(idx[d]), ir.const(index, torch.int64))
        return ir.op("where", hit, ir.cast(src.load(idx[:d] + idx[d + 1:]), out.dtype), x.load(idx))
    return Lazy(out.shape, out.dtype, out.device, load)


@register(aten.scatter.value, aten.scatter.src)
def scatter(L, node, x, dim, index, src):
    """One index per row along dim (nll_loss backward): out = index hits ? src : x. Wider indices
    (several writes per row, "last one wins" order) stay extern."""
    out = _out(node)
    d = dim % max(len(out.shape), 1)
    if not out.shape or index.sizes[d] != 1 or \
            any(a != b for i, (a, b) in enumerate(zip(index.sizes, out.shape)) if i != d):
        raise Decline

    def load(idx):
        at = idx[:d] + [Z] + idx[d + 1:]
        tgt = ir.cast(index.load(at), torch.int64)
        tgt = ir.op("where", ir.op("lt", tgt, ir.const(0, torch.int64)),
                    ir.op("add", tgt, ir.const(out.shape[d], torch.int64)), tgt)
        hit = ir.op("eq", ir.index_value(idx[d]), tgt)
        val = ir.cast(src.load(at), out.dtype) if isinstance(src, Value) else ir.const(src, out.dtype)
        return ir.op("where", hit, val, ir.cast(x.load(idx), out.dtype))
    return Lazy(out.shape, out.dtype, out.device, load)
