"""Lowerings of view and data-movement ops: index remaps, no copies.

Each view is written once as an index remap (output index -> input index), which works for any value;
on a ``Stored`` value it is also written as new sizes/strides/offset when that is possible, so extern
calls can take the view without a copy.

With symbolic sizes, output sizes come from the traced metadata (which applied eager's rules), slice
and select positions must be provably inside the dimension, and a strided view is taken only when its
strides hold for every size; otherwise the remap (FloorDiv/IMod by symbolic sizes) serves.
"""
from __future__ import annotations

import math

import sympy
import torch

from ember.native import ir
from ember.native.lowering import Lazy, Stored, TensorMeta, Unsupported, Value, out_meta, register
from ember.native.symbolic import SymbolicUnsupported, eq, is_static, norm, norm_sizes

aten = torch.ops.aten
prims = torch.ops.prims
Z = sympy.Integer(0)


def _view(x: Value, sizes, remap, strided=None) -> Value:
    """A view of x with the given sizes. ``remap(idx) -> idx of x``; ``strided() -> (strides,
    offset)`` or None, used when x is Stored."""
    sizes = norm_sizes(sizes)
    if isinstance(x, Stored) and strided is not None:
        res = strided()
        if res is not None:
            strides, offset = res
            return Stored(x.L, x.buf, sizes, strides, offset, x.dtype, x.device)
    return Lazy(sizes, x.dtype, x.device, lambda idx: x.load(remap(idx)))


def _dim(d, n):
    return d % n if n else 0


@register(aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default, aten.alias_copy.default,
          aten.detach_copy.default)
def identity(L, node, x, *rest, **kw):
    return x


@register(aten.permute.default, aten.permute_copy.default)
def permute(L, node, x, dims):
    n = len(x.sizes)
    dims = [_dim(d, n) for d in dims]
    inv = [dims.index(i) for i in range(n)]
    return _view(x, [x.sizes[d] for d in dims], lambda idx: [idx[inv[i]] for i in range(n)],
                 lambda: ([x.strides[d] for d in dims], x.offset))


@register(aten.transpose.int, aten.transpose_copy.int)
def transpose(L, node, x, d0, d1):
    n = len(x.sizes)
    dims = list(range(n))
    if n:
        d0, d1 = _dim(d0, n), _dim(d1, n)
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(L, node, x, dims)


@register(aten.t.default, aten.t_copy.default)
def t(L, node, x):
    return transpose(L, node, x, 0, 1) if len(x.sizes) == 2 else x


@register(aten.expand.default, aten.expand_copy.default)
def expand(L, node, x, sizes, implicit=False):
    n, k = len(sizes), len(x.sizes)
    out = [x.sizes[i - (n - k)] if (isinstance(s, int) and s == -1 and i >= n - k) else norm(s)
           for i, s in enumerate(sizes)]

    def remap(idx):
        return [Z if x.sizes[j] == 1 else idx[j + n - k] for j in range(k)]

    def strided():
        st = [0] * (n - k) + [0 if (x.sizes[j] == 1 and out[j + n - k] != 1) else x.strides[j] for j in range(k)]
        return st, x.offset
    return _view(x, out, remap, strided)


@register(prims.broadcast_in_dim.default)
def broadcast_in_dim(L, node, x, shape, bdims):
    def remap(idx):
        return [Z if x.sizes[j] == 1 else idx[d] for j, d in enumerate(bdims)]

    def strided():
        st = [0] * len(shape)
        for j, d in enumerate(bdims):
            st[d] = 0 if x.sizes[j] == 1 and shape[d] != 1 else x.strides[j]
        return st, x.offset
    return _view(x, shape, remap, strided)


@register(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(L, node, x, dim):
    n = len(x.sizes) + 1
    dim = _dim(dim, n)
    sizes = list(x.sizes[:dim]) + [1] + list(x.sizes[dim:])

    def strided():
        st = list(x.strides)
        st.insert(dim, st[dim] * x.sizes[dim] if dim < len(x.sizes) else 1)
        return st, x.offset
    return _view(x, sizes, lambda idx: idx[:dim] + idx[dim + 1:], strided)


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.default,
          aten.squeeze_copy.dim, aten.squeeze_copy.dims, prims.squeeze.default)
def squeeze(L, node, x, dims=None):
    n = len(x.sizes)
    if dims is None:
        dims = list(range(n))
    elif isinstance(dims, int):
        dims = [dims]
    drop = {_dim(d, n) for d in dims if n and x.sizes[_dim(d, n)] == 1}
    keep = [i for i in range(n) if i not in drop]

    def remap(idx):
        it = iter(idx)
        return [Z if i in drop else next(it) for i in range(n)]
    return _view(x, [x.sizes[i] for i in keep], remap, lambda: ([x.strides[i] for i in keep], x.offset))


def _slice_params(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start, end = min(max(start, 0), size), min(max(end, 0), size)
    return start, max(0, (end - start + step - 1) // step)


def _slice_start(L, size, start):
    """The first index of a slice of a dimension of symbolic size (its length comes from the traced
    metadata); it must be provably within [0, size], else eager's clamping would be needed."""
    start = 0 if start is None else norm(start)
    if isinstance(start, int) and start < 0:
        start = start + size
    if not (L.sv.nonneg(start) and L.sv.nonneg(size - start)):
        raise SymbolicUnsupported(f"slice start {start} of a dimension of size {size}")
    return start


@register(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(L, node, x, dim=0, start=None, end=None, step=1, length=None):
    """``length``: callers that know it (split) pass it; otherwise it is computed, or read from the
    traced metadata when sizes or bounds are symbolic."""
    n = len(x.sizes)
    dim = _dim(dim, n)
    if all(v is None or is_static(v) for v in (x.sizes[dim], start, end)):
        start, length = _slice_params(x.sizes[dim], norm(start) if start is not None else None,
                                      norm(end) if end is not None else None, step)
    else:
        start = _slice_start(L, x.sizes[dim], start)
        if length is None:
            length = out_meta(node).shape[dim]
    sizes = list(x.sizes)
    sizes[dim] = length

    def remap(idx):
        idx = list(idx)
        idx[dim] = start + step * idx[dim]
        return idx

    def strided():
        st = list(x.strides)
        st[dim] *= step
        return st, x.offset + start * x.strides[dim]
    return _view(x, sizes, remap, strided)


@register(aten.narrow.default)
def narrow(L, node, x, dim, start, length):
    return slice_(L, node, x, dim, start, start + length, 1)


@register(aten.select.int, aten.select_copy.int)
def select(L, node, x, dim, index):
    n = len(x.sizes)
    dim = _dim(dim, n)
    index = norm(index)
    if isinstance(index, int) and index < 0:
        index = index + x.sizes[dim]
    if not L.sv.nonneg(index):
        raise SymbolicUnsupported(f"select of index {index}")
    return _view(x, x.sizes[:dim] + x.sizes[dim + 1:], lambda idx: idx[:dim] + [sympy.Integer(index)] + idx[dim:],
                 lambda: (x.strides[:dim] + x.strides[dim + 1:], x.offset + index * x.strides[dim]))


@register(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(L, node, x, offset=0, dim1=0, dim2=1):
    n = len(x.sizes)
    d1, d2 = _dim(dim1, n), _dim(dim2, n)
    rest = [i for i in range(n) if i not in (d1, d2)]
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    length = out_meta(node).shape[-1]
    sizes = [x.sizes[i] for i in rest] + [length]

    def remap(idx):
        full = [Z] * n
        for j, i in enumerate(rest):
            full[i] = idx[j]
        full[d1], full[d2] = r0 + idx[-1], c0 + idx[-1]
        return full
    return _view(x, sizes, remap, lambda: ([x.strides[i] for i in rest] + [x.strides[d1] + x.strides[d2]],
                                         x.offset + r0 * x.strides[d1] + c0 * x.strides[d2]))


def _infer_size(sizes, numel):
    sizes = [norm(s) for s in sizes]
    if -1 in sizes:
        i = sizes.index(-1)
        rest = math.prod(s for s in sizes if not (isinstance(s, int) and s == -1))
        if isinstance(numel, int) and isinstance(rest, int):
            sizes[i] = numel // rest if rest else 0
        else:
            q = sympy.cancel(sympy.sympify(numel) / rest)
            if not q.is_polynomial() or q.as_numer_denom()[1] != 1:
                raise SymbolicUnsupported(f"view of {numel} elements as {sizes}")
            sizes[i] = norm(sympy.expand(q))
    return sizes


def _view_strides(old_sizes, old_strides, new_sizes, hint=None):
    """Strides for viewing (old_sizes, old_strides) as new_sizes without a copy, or None
    (the algorithm of ATen's computeStride). With symbolic sizes, dims are grouped by comparing
    hints, and each group must then match exactly, so the strides hold for every size."""
    if math.prod(old_sizes) == 0 or not old_sizes:
        return list(ir.contiguous_strides(new_sizes))

    def less(a, b):
        if isinstance(a, int) and isinstance(b, int):
            return a < b
        return hint is not None and hint(a) < hint(b)
    new_strides = [0] * len(new_sizes)
    view_d = len(new_sizes) - 1
    chunk_base_stride = old_strides[-1]
    tensor_numel, view_numel = 1, 1
    for tensor_d in range(len(old_sizes) - 1, -1, -1):
        tensor_numel *= old_sizes[tensor_d]
        if tensor_d == 0 or (old_sizes[tensor_d - 1] != 1 and
                             not eq(old_strides[tensor_d - 1], tensor_numel * chunk_base_stride)):
            while view_d >= 0 and (less(view_numel, tensor_numel) or new_sizes[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_sizes[view_d]
                view_d -= 1
            if not eq(view_numel, tensor_numel):
                return None
            if tensor_d > 0:
                chunk_base_stride = old_strides[tensor_d - 1]
                tensor_numel, view_numel = 1, 1
    if view_d != -1:
        return None
    return new_strides


def reshape_value(x: Value, sizes, hint=None) -> Value:
    """x viewed as sizes (-1 allowed); ``hint``: size expression -> int, for symbolic sizes."""
    sizes = _infer_size(sizes, x.numel)
    if list(sizes) == list(x.sizes):
        return x
    old = x.sizes
    in_cs = ir.contiguous_strides(old)
    out_cs = ir.contiguous_strides(sizes)

    def remap(idx):
        flat = sum((i * s for i, s, n in zip(idx, out_cs, sizes) if n != 1), Z)
        res, first = [], True
        for n, cs in zip(old, in_cs):
            if n == 1:
                res.append(Z)
                continue
            e = ir.FloorDiv(flat, cs) if cs != 1 else flat
            res.append(e if first else ir.IMod(e, n))  # the outermost dim needs no modulo
            first = False
        return res

    def strided():
        st = _view_strides(list(x.sizes), list(x.strides), sizes, hint)
        return None if st is None else (st, x.offset)
    return _view(x, sizes, remap, strided)


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
          aten._reshape_alias.default, prims.reshape.default)
def view(L, node, x, sizes, *rest):
    return reshape_value(x, out_meta(node).shape, L.sv.hint)


@register(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(L, node, x, size, stride, storage_offset=None):
    """as_strided addresses eager's storage. Graph inputs are that storage; for other values it is
    known only when eager's tensor is contiguous from offset 0 (decompositions do this, e.g.
    group_norm): storage position p is then element p of x in row-major order."""
    meta = node.args[0].meta.get("val")
    if not isinstance(meta, torch.Tensor):
        raise Unsupported("as_strided without metadata")
    base_off = norm(meta.storage_offset())
    off = norm(storage_offset) if storage_offset is not None else base_off
    if isinstance(x, Stored) and any(b.name == x.buf for b in L.inputs) and x.is_whole(L.layouts[x.buf]):
        return Stored(L, x.buf, size, stride, off - base_off, x.dtype, x.device)
    size, stride = norm_sizes(size), norm_sizes(stride)
    if all(is_static(v) for v in (*size, *stride, off, base_off, x.numel)):
        last = off + sum((s - 1) * st for s, st in zip(size, stride)) if all(s > 0 for s in size) else 0
        inside = last < max(x.numel, 1)
        contiguous = meta.is_contiguous()
    else:  # proofs instead of comparisons (and no is_contiguous(): it would guard on the sizes)
        last = off + sum((s - 1) * st for s, st in zip(size, stride))
        inside = all(s != 0 for s in size) and L.sv.nonneg(x.numel - 1 - last)
        m = TensorMeta(meta)
        contiguous = all(sz == 1 or eq(a, b) for sz, a, b in zip(m.shape, m.stride(), ir.contiguous_strides(m.shape)))
    if base_off != 0 or not contiguous or not inside:
        raise Unsupported("as_strided of an intermediate whose eager storage differs from ours")
    cs = ir.contiguous_strides(x.sizes)

    def remap(idx):
        p = off + sum((i * st for i, st, n in zip(idx, stride, size) if n != 1), Z)
        out, first = [], True
        for n, c in zip(x.sizes, cs):
            if n == 1:
                out.append(Z)
                continue
            e = ir.FloorDiv(p, c) if c != 1 else p
            out.append(e if first else ir.IMod(e, n))
            first = False
        return out
    return _view(x, size, remap)


def _is_contig(x):
    return tuple(x.strides) == ir.contiguous_strides(x.sizes)


@register(aten.split.Tensor, aten.split_copy.Tensor)
def split(L, node, x, split_size, dim=0):
    n = len(x.sizes)
    d = _dim(dim, n)
    size = x.sizes[d]
    if not (is_static(size) and is_static(split_size)):  # the traced pieces know their sizes
        return split_with_sizes(L, node, x, [norm(t.shape[d]) for t in node.meta["val"]], dim)
    sizes = [min(split_size, size - s) for s in range(0, size, split_size)] if split_size else [0]
    return split_with_sizes(L, node, x, sizes or [0], dim)


@register(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(L, node, x, sizes, dim=0):
    out, start = [], 0
    for s in sizes:
        s = norm(s)
        out.append(slice_(L, node, x, dim, start, start + s, 1, length=s))
        start += s
    return out


@register(aten.unbind.int, aten.unbind_copy.int)
def unbind(L, node, x, dim=0):
    d = _dim(dim, len(x.sizes))
    if not is_static(x.sizes[d]):
        raise SymbolicUnsupported(f"unbind of a dimension of symbolic size {x.sizes[d]}")
    return [select(L, node, x, d, i) for i in range(x.sizes[d])]


@register(aten.flip.default)
def flip(L, node, x, dims):
    n = len(x.sizes)
    dims = {_dim(d, n) for d in dims}
    return _view(x, x.sizes, lambda idx: [(x.sizes[i] - 1 - v) if i in dims else v for i, v in enumerate(idx)])


@register(aten.roll.default)
def roll(L, node, x, shifts, dims=()):
    if not dims:
        flat = reshape_value(x, [x.numel])
        return reshape_value(roll(L, node, flat, shifts, [0]), x.sizes)
    n = len(x.sizes)
    sh = {_dim(d, n): s for d, s in zip(dims, shifts)}
    if not all(is_static(x.sizes[d]) and is_static(s) for d, s in sh.items()):
        raise SymbolicUnsupported("roll along a dimension of symbolic size")

    def remap(idx):
        out = []
        for i, v in enumerate(idx):
            if i in sh and x.sizes[i] > 0:
                out.append(ir.IMod(v + (x.sizes[i] - sh[i] % x.sizes[i]), x.sizes[i]))
            else:
                out.append(v)
        return out
    return _view(x, x.sizes, remap)


@register(aten.repeat.default)
def repeat(L, node, x, repeats):
    n = len(repeats)
    k = len(x.sizes)
    xs = [1] * (n - k) + list(x.sizes)
    sizes = [a * r for a, r in zip(xs, repeats)]

    def remap(idx):
        return [Z if xs[j + n - k] == 1 else ir.IMod(idx[j + n - k], xs[j + n - k]) for j in range(k)]
    return _view(x, sizes, remap)
