"""Patchify convolutions as one matmul (an FX pass before lowering).

A vision transformer's patch embedding is a convolution whose stride equals its kernel: the windows
tile the image without overlapping, so every output pixel is one row of patches times the flattened
weight. On an H100 cuDNN runs ViT-B/16's (``[64, 3, 224, 224]`` bf16, kernel = stride = 16, 768
channels) as two NCHW->NHWC layout kernels and a CUTLASS convolution, 0.57 ms per step, while the same
14.8 GFLOP as one cuBLAS GEMM take ~0.05 ms after a ~0.02 ms copy that gathers the patches
(``benchmarks/probes/patchify_conv.py`` times both). The pass rewrites, for d = 1, 2 or 3 spatial dims,

    convolution(x, w, b, stride=k, padding=0, dilation=1, transposed=False, groups=1)
      ->  x[..., :o*k]                        crop what the convolution's floor drops
          .view(N, C, o1, k1, ..., od, kd)    split each spatial dim into (patch, offset)
          .permute(N, o..., C, k...)          one patch per row (or (k..., C) for channels-last x)
          .clone().view(N*prod(o), C*prod(k)) the gather copy; fused with x's producer if any
          addmm(b, patches, w.view(O, C*prod(k)).t())
          .view(N, o..., O).permute(N, O, o...)

The result has the convolution's values (up to the matmul's rounding) in channels-last strides,
which is what eager returns for a channels-last input; where eager's result is contiguous a
``clone(memory_format=contiguous)`` keeps eager's strides, so every later op (a ``view`` traced on
eager's layout, a graph output) sees exactly what eager gives it, also when the graph runs as ATen
code. The native lowering turns that clone into an index remap read by the consumers' kernels (the
ViT's ``flatten(2).transpose(1, 2)`` then reads the matmul's rows in order): no copy is left.

Only forward graphs have convolutions: in training the backward keeps eager's
``convolution_backward`` on the same saved input and weight, so gradients are eager's.

Where it applies is a table (``APPLY``, by device type and dtype: CUDA bf16 and fp16); CPU graphs
keep the convolution (MKL-DNN's and the gather + MKL GEMM measured about even) unless ``on_cpu``
(the tests of the Triton interpreter path) asks for the rewrite. Symbolic sizes are left alone.
"""
from __future__ import annotations

import math

import torch
from torch._subclasses.fake_tensor import FakeTensor

aten = torch.ops.aten

# device type -> dtypes the rewrite runs for.
# CUDA bf16/fp16: cuDNN's patchify kernel plus its layout conversions cost ~10x the GEMM (ViT-B/16's
#   profile, issue 28; the probe above times them). fp32 is not listed: eager's fp32 convolution runs
#   on TF32 tensor cores by default (torch.backends.cudnn.allow_tf32) while an fp32 matmul does not
#   (torch.backends.cuda.matmul.allow_tf32 is off by default), so the rewrite would change the
#   precision and likely be slower; the probe prints fp32 both ways for whoever adds it.
# CPU: not listed. Eager ATen at ViT-B/16 and ViT-L/14 shapes (batch 8, fp32, 2 shared cores, noisy):
#   MKL-DNN's convolution 92 / 76 ms against gather + MKL GEMM 81 / 92 ms: no clear win.
APPLY = {"cuda": (torch.bfloat16, torch.float16)}

# what the output code says about the nodes made here (the lowering appends it to extern comments)
NOTE_KEY = "ember_rewrite"


def _ints(*seqs) -> bool:
    return all(type(v) is int for s in seqs for v in s)


def match(node, on_cpu: bool = False):
    """(x, w, b, kernel) of a patchify convolution node the table lets us rewrite, else None."""
    if node.op != "call_function" or node.target is not aten.convolution.default or node.kwargs:
        return None
    x, w, b, stride, padding, dilation, transposed, _out_pad, groups = node.args
    vx, vw, vo = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in (x, w, node))
    if not all(isinstance(v, FakeTensor) for v in (vx, vw, vo)):
        return None
    d = vw.dim() - 2
    if not 1 <= d <= 3 or vx.dim() != d + 2 or transposed or groups != 1:
        return None
    kernel = tuple(vw.shape[2:])
    if not _ints(vx.shape, vx.stride(), vw.shape, vw.stride(), vo.stride(), stride, padding, dilation):
        return None
    # stride == kernel, no padding: windows tile the input; dilation only matters for kernels > 1
    if tuple(stride) != kernel or any(padding) or any(dl != 1 and k != 1 for dl, k in zip(dilation, kernel)):
        return None
    if math.prod(kernel) < 2:  # a 1x1 convolution: not a patchify (cuDNN's own GEMM path; unmeasured)
        return None
    if vx.numel() == 0 or vo.numel() == 0 or vx.dtype != vw.dtype:
        return None
    if not (on_cpu or vx.dtype in APPLY.get(vx.device.type, ())):
        return None
    if b is not None and not (isinstance(b, torch.fx.Node) and isinstance(b.meta.get("val"), torch.Tensor)
                              and b.meta["val"].dtype == vx.dtype):
        return None
    if len({id(v.fake_mode) for v in (vx, vw, vo, *([b.meta["val"]] if b is not None else []))}) != 1:
        return None  # (a graph traced in real mode: metadata from several fake modes, not to mix)
    if _final_memory_format(vo) is False:
        return None
    return x, w, b, kernel


def _channels_last_strides(shape) -> tuple:
    """Strides of [N, O, o1..od] laid out as [N, o1..od, O] (what the matmul's rows give)."""
    n, o, *sp = shape
    st = [0] * len(shape)
    acc = 1
    st[1], acc = acc, acc * o
    for i in range(len(sp) - 1, -1, -1):
        st[2 + i], acc = acc, acc * sp[i]
    st[0] = acc
    return tuple(st)


def _same(shape, a, b) -> bool:
    return all(s == 1 or x == y for s, x, y in zip(shape, a, b))


def _final_memory_format(vo):
    """None when the matmul's channels-last result already has eager's strides, the memory format
    to clone it into when eager's are contiguous, False otherwise (not rewritten)."""
    if _same(vo.shape, vo.stride(), _channels_last_strides(tuple(vo.shape))):
        return None
    if vo.is_contiguous():
        return torch.contiguous_format
    return False


def rewrite(gm: torch.fx.GraphModule, on_cpu: bool = False) -> int:
    """Rewrite the patchify convolutions of ``gm`` in place; returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        m = match(node, on_cpu)
        if m is None:
            continue
        _rewrite(gm.graph, node, *m)
        count += 1
    if count:  # (no dead-code pass: nothing else lost its users, and it could drop an unused random op)
        gm.graph.lint()
        gm.recompile()
    return count


def _rewrite(graph, node, x, w, b, kernel):
    vx, vw, vo = x.meta["val"], w.meta["val"], node.meta["val"]
    d = len(kernel)
    n, c, *spatial = vx.shape
    o = [s // k for s, k in zip(spatial, kernel)]
    cout = vw.shape[0]
    note = (f"patchify conv{d}d {list(vx.shape)} kernel=stride={list(kernel)} as a matmul "
            f"[{n * math.prod(o)}, {c * math.prod(kernel)}] x [{c * math.prod(kernel)}, {cout}] (patchify.py)")

    def add(target, *args, **kwargs):
        new = graph.call_function(target, args, kwargs)
        new.meta.update({key: v for key, v in node.meta.items() if key not in ("val", "tensor_meta")})
        new.meta[NOTE_KEY] = note
        with vo.fake_mode:
            new.meta["val"] = target(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args), **kwargs)
        return new

    # channels-last input (channel stride 1): patch rows ordered (k..., C) read x in runs of C
    cl = c > 1 and vx.stride(1) == 1
    with graph.inserting_before(node):
        for i, (s, oi, k) in enumerate(zip(spatial, o, kernel)):
            if s != oi * k:  # the convolution drops the last s % k positions
                x = add(aten.slice.Tensor, x, 2 + i, 0, oi * k)
        split = [n, c] + [v for oi, k in zip(o, kernel) for v in (oi, k)]
        x = add(aten.view.default, x, split)
        outer = [2 + 2 * i for i in range(d)]
        inner = [3 + 2 * i for i in range(d)]
        x = add(aten.permute.default, x, [0, *outer, *inner, 1] if cl else [0, *outer, 1, *inner])
        x = add(aten.clone.default, x, memory_format=torch.contiguous_format)
        patches = add(aten.view.default, x, [n * math.prod(o), c * math.prod(kernel)])
        if cl:
            w = add(aten.permute.default, w, [0, *range(2, 2 + d), 1])
        if not w.meta["val"].is_contiguous():
            w = add(aten.clone.default, w, memory_format=torch.contiguous_format)
        wt = add(aten.permute.default, add(aten.view.default, w, [cout, c * math.prod(kernel)]), [1, 0])
        out = add(aten.mm.default, patches, wt) if b is None else add(aten.addmm.default, b, patches, wt)
        out = add(aten.view.default, out, [n, *o, cout])
        out = add(aten.permute.default, out, [0, d + 1, *range(1, d + 1)])
        fmt = _final_memory_format(vo)
        if fmt is not None:
            out = add(aten.clone.default, out, memory_format=fmt)
    assert tuple(out.meta["val"].shape) == tuple(vo.shape), (out.meta["val"].shape, vo.shape)
    node.replace_all_uses_with(out)
    graph.erase_node(node)
