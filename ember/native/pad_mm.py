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


def pad_matmuls(gm: torch.fx.GraphModule, min_flops: int = DEFAULT_MIN_FLOPS, on_cpu: bool = False) -> int:
    """Rewrite misaligned large mm/addmm nodes of ``gm`` in place; returns how many were padded.
    ``on_cpu``: also rewrite CPU matmuls (tests of the Triton interpreter path)."""
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


def _bias_pads(shape, m, n, pm, pn) -> list:
    """addmm's bias broadcasts against (m, n): pad the dims it actually spans."""
    pads = [0, pn] if shape and shape[-1] == n and n > 1 else [0, 0]
    if len(shape) == 2 and shape[0] == m and m > 1:
        pads += [0, pm]
    return pads
