"""Pad matmuls whose sizes break cuBLAS's alignment (an FX pass before lowering).

cuBLAS picks its fast tensor-core kernels only when every leading dimension is a multiple of 16
bytes. A language-model head is the common victim: GPT-2's vocabulary of 50257 makes the logits
``mm`` (and, in training, both of its backward matmuls) fall back to an ``align1`` kernel about 7x
slower than the aligned one (3.3 ms against 0.45 ms for GPT-2 124M at batch 8x512 on an H100).

The pass rewrites ``mm(a, b)`` / ``addmm(bias, a, b)`` with a misaligned M, K or N into the same
product on zero-padded operands, followed by a slice back to the original size::

    mm(a, b)  ->  slice(mm(pad(a), pad(b)))      # K padded with zeros: the sums are unchanged

Padding copies an operand (one pass over it, fused by the lowering into the producer's kernel when
it is computed), which only pays off for large products: ``min_flops`` bounds it from below. The
product stays padded: users read the slice through its strides, and a graph output keeps them (the
logits come back with a row stride of 50264, as they do from the reference compiler, whose padding
does the same; copying them out would cost more than the matmul).
Symbolic sizes are left alone (their alignment is unknown when compiling).

What cuBLAS needs aligned is the leading dimensions (row strides), not the sizes. When only N is
misaligned and both operands are already laid out with aligned leading dimensions (GPT-2's logits
at inference: the activations [M, 768] row-major, the tied embedding read as ``w.t()``, column-major
with leading dimension 768), nothing needs copying: ``mm`` becomes ``ember_native::mm_rows``, the
same product written into a result whose rows are N rounded up apart (``rows=True``, the default;
``NativeOptions.pad_mm_rows``). The result and everything downstream have the strides the padded
path gives (the slice of a padded product), so the two paths differ only in the copy of the weight
that padding makes on every call (GPT-2 124M: 77 MB read and written, ~0.05 ms on an H100, one
launch). The gap between the rows is never read (it is left unwritten). ``addmm`` keeps the padded
path: ATen's addmm into a strided result first copies the broadcast bias into it (a pass over the
whole [M, N] result, larger than the weight).
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from ember.native.options import NativeOptions

aten = torch.ops.aten

# bytes per leading dimension that cuBLAS wants for its fast kernels
ALIGN_BYTES = 16
DEFAULT_MIN_FLOPS = NativeOptions.pad_mm_min_flops  # the one default lives in options.py


def _align(dtype: torch.dtype) -> int | None:
    if not dtype.is_floating_point:
        return None
    return max(1, ALIGN_BYTES // dtype.itemsize)


def _static(*sizes) -> bool:
    return all(isinstance(s, int) for s in sizes)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@torch.library.custom_op("ember_native::mm_rows", mutates_args=())
def mm_rows(a: torch.Tensor, b: torch.Tensor, row_stride: int) -> torch.Tensor:
    """``a @ b`` into an [M, N] result whose rows are ``row_stride`` (>= N) elements apart: cuBLAS
    takes such a result as it is (its leading dimension is the row stride), so a row stride that is
    a multiple of 16 bytes gets the aligned kernels whatever N is."""
    out = torch.empty_strided((a.shape[0], b.shape[1]), (row_stride, 1), dtype=a.dtype, device=a.device)
    return torch.mm(a, b, out=out)  # (mm's out= keeps a strided result's strides: no copy)


@mm_rows.register_fake
def _(a, b, row_stride):
    return a.new_empty_strided((a.shape[0], b.shape[1]), (row_stride, 1))


MM_ROWS = torch.ops.ember_native.mm_rows.default


def _blas_aligned(v: torch.Tensor, al: int) -> bool:
    """v (2-D) is laid out as cuBLAS wants it: row- or column-major with a leading dimension and
    offset that are multiples of ``al`` elements."""
    if v.dim() != 2 or v.storage_offset() % al:
        return False
    (r, c), (s0, s1) = v.shape, v.stride()
    if s1 == 1 and (s0 % al == 0 or r == 1) and s0 >= c:
        return True
    return s0 == 1 and (s1 % al == 0 or c == 1) and s1 >= r


def pad_matmuls(gm: torch.fx.GraphModule, min_flops: int = DEFAULT_MIN_FLOPS, on_cpu: bool = False,
                rows: bool = True) -> int:
    """Rewrite misaligned large mm/addmm nodes of ``gm`` in place; returns how many were rewritten.
    ``on_cpu``: also rewrite CPU matmuls (tests of the Triton interpreter path). ``rows``: an ``mm``
    misaligned only in N whose operands are aligned becomes ``mm_rows`` (no copy) instead of padded."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        if node.kwargs:  # addmm's beta/alpha: rare, not worth a second code path
            continue
        bias, a, b = (None, *node.args) if node.target is aten.mm.default else node.args
        va, vb, vo = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in (a, b, node))
        if not all(isinstance(v, FakeTensor) for v in (va, vb, vo)) or not (va.device.type == "cuda" or on_cpu):
            continue
        (m, k), n = va.shape, vb.shape[1]
        if not _static(m, k, n):
            continue
        al = _align(va.dtype)
        if al is None or 2 * m * n * k < min_flops or not (m % al or k % al or n % al):
            continue
        if bias is not None and not (isinstance(bias, torch.fx.Node)
                                     and isinstance(bias.meta.get("val"), torch.Tensor)):
            continue
        if rows and bias is None and n % al and _blas_aligned(va, al) and _blas_aligned(vb, al):
            _rewrite_rows(gm.graph, node, a, b, _round_up(n, al), vo)
        else:
            _rewrite(gm.graph, node, bias, a, b, (m, k, n), al, vo)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
        _refresh_metadata(gm)
    return count


def _refresh_metadata(gm: torch.fx.GraphModule) -> None:
    """Re-run the graph on its placeholders' fakes: the sliced products have padded strides, and so
    do the views of them downstream (a graph output among them is returned with those strides, as
    the reference compiler does, instead of being copied: for GPT-2's logits the copy costs more than the
    matmul)."""
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    mode = next((v.fake_mode for v in vals if isinstance(v, FakeTensor)), None)
    if mode is None:
        return
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*vals)


def _rewrite(graph, node, bias, a, b, sizes, al, out_val):
    m, k, n = sizes
    pm, pk, pn = (_round_up(s, al) - s for s in sizes)

    def add(target, *args):
        new = graph.call_function(target, args)
        new.meta.update({key: v for key, v in node.meta.items() if key != "val"})
        with out_val.fake_mode:
            new.meta["val"] = target(*(x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in args))
        return new

    def pad(x, rows, cols):
        # constant_pad_nd pads the last dim first: [last_lo, last_hi, first_lo, first_hi]. Its
        # result is row-major, so a column-major operand (a Linear weight read as w.t()) is padded
        # as its transpose and transposed back: the copy then reads and writes rows (GPT-2's logits
        # weight: 0.30 ms as a transposing copy on an H100, ~0.05 ms this way), and cuBLAS takes
        # the transposed operand as it is.
        st = x.meta["val"].stride()
        if st[0] == 1 and st[1] != 1:
            xt = add(aten.permute.default, x, [1, 0])
            return add(aten.permute.default, add(aten.constant_pad_nd.default, xt, [0, rows, 0, cols]), [1, 0])
        return add(aten.constant_pad_nd.default, x, [0, cols, 0, rows])

    with graph.inserting_before(node):
        if pm or pk:
            a = pad(a, pm, pk)
        if pk or pn:
            b = pad(b, pk, pn)
        if bias is None:
            out = add(aten.mm.default, a, b)
        else:
            pads = _bias_pads(tuple(bias.meta["val"].shape), m, n, pm, pn)
            if any(pads):
                bias = add(aten.constant_pad_nd.default, bias, pads)
            out = add(aten.addmm.default, bias, a, b)
        for dim, size, pad in ((1, n, pn), (0, m, pm)):
            if pad:
                out = add(aten.slice.Tensor, out, dim, 0, size)
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def _rewrite_rows(graph, node, a, b, row_stride, out_val):
    with graph.inserting_before(node):
        new = graph.call_function(MM_ROWS, (a, b, row_stride))
    new.meta.update({key: v for key, v in node.meta.items() if key != "val"})
    new.meta["ember_rewrite"] = f"pad_mm: rows {row_stride} apart, for cuBLAS's alignment"
    with out_val.fake_mode:
        new.meta["val"] = MM_ROWS(a.meta["val"], b.meta["val"], row_stride)
    node.replace_all_uses_with(new)
    graph.erase_node(node)


def _bias_pads(shape, m, n, pm, pn) -> list:
    """addmm's bias broadcasts against (m, n): pad the dims it actually spans."""
    pads = [0, pn] if shape and shape[-1] == n and n > 1 else [0, 0]
    if len(shape) == 2 and shape[0] == m and m > 1:
        pads += [0, pm]
    return pads
