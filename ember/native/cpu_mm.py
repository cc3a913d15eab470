"""FX rewrites of large CPU matmuls for the C++ path (``backend.plan`` runs them before lowering).

* ``fuse_activations``: an activation applied to a large ``addmm`` runs inside ATen's
  ``_addmm_activation``, in place on the matmul's result.
* ``unfuse_bias``: a large ``addmm`` whose result only feeds ops the C++ kernels compute becomes
  ``mm`` plus the bias added in those kernels.

Why: a ReLU after a Linear otherwise becomes a C++ kernel writing a second buffer of the matmul's
size; for the encoder row of ``benchmarks/cpu_suite.py`` (``[2048, 1024]`` fp32, 8 MiB) that fresh
buffer is page-faulted in on every call, and the kernel took ~4x eager's in-place ``clamp_min_``
(torch.profiler, 1 thread, 2-core VM). ``_addmm_activation`` is what eager's fused encoder layer calls:
on CPU it runs the addmm and then the activation in place (ReLU, or GELU in its erf form), so no
second buffer exists. Small batches are left alone: there ``packed_linear`` takes the addmm (MKL's
packed weight) and the activation's kernel costs little.

Bias. ``addmm`` on CPU first fills its [M, N] result with the broadcast bias (a ``copy_``) and then
runs the GEMM with beta=1, which reads that result back: one more write and read of the whole
output than ``mm``. Where the result goes on to a fused kernel anyway (the encoder's residual add +
layer_norm after its attention projection and second Linear) adding the bias there is free: the
encoder row's ``copy_`` time drops by the two [2048, 256] outputs' share. torch.compile's Inductor
does the same (its ``unfuse_bias_add_to_pointwise``).

* ``unpermute_rows``: ``mm(view(clone(permute(x, p)), [M, K]), w)`` with ``p`` keeping the last dim
  (only the row dims reordered) -> ``mm(view(x, [M, K]), w)``, whose result is then viewed and permuted
  back for the ops that read it.

Why: a row permutation commutes with a matmul (row i of the result is row i of the input times ``w``),
so the permuted copy of the input exists only because ``view`` needs a contiguous tensor. The
encoder row's ``MultiheadAttention(batch_first=True)`` transposes its [b, s, d] input to [s, b, d]
before the in-projection: ember copied the 2 MiB input into a [s*b, d] buffer on every call (a C++
kernel of 0.17-0.4 ms at 1 thread on the shared VM, about 1% of the row). Eager's fused encoder layer
never makes that copy either. After the rewrite the permutation is a view, which the fused kernel
reading the matmul's result (the q/k/v split with the bias add) folds into its index arithmetic.
Only where every use of the matmul's result is the view back to the permuted shape, none a graph
output (an output keeps the strides eager gives it).

* ``transpose_small_mm``: a Linear of few rows, ``addmm(bias, x, w.t())`` or ``mm(x, w.t())``, is
  computed as ``mm(w, x.t())``, the transposed result, which the consumers read through a
  transposed view (the bias added in their kernel, as ``unfuse_bias``).

Why: ATen hands MKL the GEMM in the orientation of the result's layout, and for a row-major
``[M, N]`` result of ``x @ w.t()`` with M small MKL's kernel for that orientation is much slower
than for the column-major one (the same product, ``w @ x.t()`` written row-major). 1 thread, CPU
time (2-core Xeon VM, MKL, fp32): x[32, 1024] @ w[1024, 1024]^T 654 us (addmm) -> 404 us,
x[32, 512] @ w[1024, 512]^T 283 -> 200 us, N=10 14 -> 7.5 us; M=64 1.1x, M=128 and more no gain;
2 threads (a shared machine: fastest of 300 alternating calls) 309 -> 184 us and 155 -> 83 us. The
backward's ``dz @ w`` (w row-major) is the other way round (row-major result faster: 470 vs 598 us),
so only the ``w.t()`` form is rewritten. Where ``packed_linear`` takes the call (inference: MKL's
packed weight, about as fast at M=32 and faster at 64-128) it is left to it; training forwards, which
never pack, are where this applies (the ``mlp_train`` row of ``benchmarks/cpu_suite.py``).
"""
from __future__ import annotations

import math

import torch

from ember.native import lowering, mm_epilogue
from ember.native.fx_match import gelu_of, is_call
from ember.native.mm_epilogue import VIEWS, Epilogue

aten = torch.ops.aten

# smallest number of rows (M) of an addmm rewritten (below it, packed_linear.RULES: MKL packed GEMM)
MIN_ROWS = 129
DTYPES = (torch.float32, torch.float64)  # (ATen's CPU _addmm_activation: what eager's encoder uses)


# the activations fuse_activations moves into _addmm_activation (mm_epilogue.fuse); on CPU use_gelu=True
# computes the erf GELU, matched in its decomposed form (fx_match.gelu_of)
EPILOGUES = (
    Epilogue("relu", mm_epilogue.relu_of, use_gelu=False),
    Epilogue("erf GELU", gelu_of, use_gelu=True),
)


def fuse_activations(gm: torch.fx.GraphModule) -> int:
    """``act(addmm(bias, x, w))`` -> ``_addmm_activation(bias, x, w, use_gelu=...)`` for CPU addmms of
    MIN_ROWS rows or more whose result feeds only the activation. Returns the count."""
    return mm_epilogue.fuse(gm, _big_addmm, EPILOGUES)


def _big_addmm(n):
    """n is ``addmm(bias, x, w)`` on CPU (DTYPES) with a static row count of MIN_ROWS or more."""
    if not is_call(n, aten.addmm.default, None, None, None):
        return False
    out = n.meta.get("val")
    vals = [getattr(a, "meta", {}).get("val") for a in n.args]
    if not isinstance(out, torch.Tensor) or not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    if out.device.type != "cpu" or out.dtype not in DTYPES or any(v.dtype != out.dtype for v in vals):
        return False
    return out.dim() == 2 and type(out.shape[0]) is int and out.shape[0] >= MIN_ROWS


def _fused_users_only(n, depth=0) -> bool:
    """Every use of n (through views) is an op the C++ kernels compute: not an extern call, not a
    graph output."""
    for u in n.users:
        if u.op != "call_function" or u.target not in lowering.LOWERINGS or u.target in lowering.EXTERN_OPS:
            return False
        if u.target in VIEWS and not (depth < 4 and _fused_users_only(u, depth + 1)):
            return False
    return bool(n.users)


def unfuse_bias(gm: torch.fx.GraphModule) -> int:
    """``addmm(bias, x, w)`` -> ``add(mm(x, w), bias)`` where the result feeds fused kernels only (module
    docstring). Returns the count."""
    from ember.native import lower_ops, lower_pool, lower_views  # noqa: F401  (fill lowering's tables)
    g, done = gm.graph, 0
    for n in list(g.nodes):
        if not _big_addmm(n) or not _fused_users_only(n):
            continue
        bias, x, w = n.args
        if bias.meta["val"].dim() != 1:  # (a full [M, N] addend: nothing to save)
            continue
        with g.inserting_before(n):
            mm = g.call_function(aten.mm.default, (x, w))
            mm.meta = dict(n.meta)
            add = g.call_function(aten.add.Tensor, (mm, bias))
            add.meta = dict(n.meta)
        n.replace_all_uses_with(add)
        g.erase_node(n)
        done += 1
    if done:
        gm.recompile()
    return done


def _row_permuted_input(a):
    """(x, p) where ``a`` is ``view(clone(permute(x, p)), [M, K])`` with x contiguous of static sizes,
    ``p`` a permutation keeping the last dim, M the product of the other dims; else None."""
    if not (isinstance(a, torch.fx.Node) and a.op == "call_function" and a.target in VIEWS and len(a.users) == 1):
        return None
    clone = a.args[0]
    if not (isinstance(clone, torch.fx.Node) and clone.op == "call_function" and clone.target is aten.clone.default
            and clone.kwargs.get("memory_format", torch.contiguous_format) is torch.contiguous_format):
        return None
    perm = clone.args[0]
    if not (isinstance(perm, torch.fx.Node) and perm.op == "call_function" and perm.target is aten.permute.default):
        return None
    x, p = perm.args
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(xv, torch.Tensor) or xv.dim() < 3 or not all(type(d) is int for d in xv.shape):
        return None
    n = xv.dim()
    p = [d % n for d in p]
    if p[-1] != n - 1 or p == list(range(n)) or not xv.is_contiguous():
        return None
    if _shape(a) != [math.prod(xv.shape[:-1]), xv.shape[-1]]:
        return None
    return x, p


def _shape(n) -> list | None:
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return list(v.shape) if isinstance(v, torch.Tensor) else None


def _meta(node, target, args):
    """node.meta["val"] from the op run on its arguments' meta values (fake tensors)."""
    node.meta["val"] = target(*[a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args])


def unpermute_rows(gm: torch.fx.GraphModule) -> int:
    """``mm(view(clone(permute(x, p)), [M, K]), w)`` (or ``addmm`` with a 1-D bias) whose result is used
    only through ``view`` to the permuted [*rows, N] shape -> the matmul of ``view(x, [M, K])``, its
    result viewed as [*x rows, N] and permuted by ``p`` (module docstring). Returns the count."""
    g, done = gm.graph, 0
    for n in list(g.nodes):
        if is_call(n, aten.mm.default, None, None):
            pos = 0
        elif is_call(n, aten.addmm.default, None, None, None) and len(_shape(n.args[0]) or ()) == 1:
            pos = 1  # (a 1-D bias: the same for every row, in any order)
        else:
            continue
        out = n.meta.get("val")
        found = _row_permuted_input(n.args[pos])
        if found is None or not isinstance(out, torch.Tensor) or out.device.type != "cpu":
            continue
        x, p = found
        xs = list(x.meta["val"].shape)
        N = out.shape[1]
        if type(N) is not int:
            continue
        permuted = [xs[d] for d in p[:-1]] + [N]
        views = list(n.users)
        if not views or any(not (u.op == "call_function" and u.target in VIEWS and _shape(u) == permuted
                                 and all(w.op != "output" for w in u.users)) for u in views):
            continue
        with g.inserting_before(n):
            flat = g.call_function(aten.view.default, (x, [math.prod(xs[:-1]), xs[-1]]))
            _meta(flat, aten.view.default, flat.args)
            args = list(n.args)
            args[pos] = flat
            mm = g.call_function(n.target, tuple(args))
            _meta(mm, n.target, mm.args)
            mm.meta["ember_rewrite"] = "cpu_mm.unpermute_rows: the row permutation of its input moved after it"
            rows = g.call_function(aten.view.default, (mm, xs[:-1] + [N]))
            _meta(rows, aten.view.default, rows.args)
            back = g.call_function(aten.permute.default, (rows, p))
            _meta(back, aten.permute.default, back.args)
        for u in views:
            u.replace_all_uses_with(back)
            g.erase_node(u)
        old_in = n.args[pos]
        g.erase_node(n)
        for dead in (old_in, old_in.args[0], old_in.args[0].args[0]):  # view, clone, permute if now unused
            if not dead.users:
                g.erase_node(dead)
        done += 1
    if done:
        gm.recompile()
    return done


# largest number of rows (M) of a Linear computed transposed (transpose_small_mm; module docstring)
T_MAX_ROWS = 64


def _static_2d(v) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() == 2 and all(type(s) is int for s in (*v.shape, *v.stride()))


def _small_linear(n):
    """(bias or None, x, w.t()) of ``n``, an ``addmm(bias, x, w.t())`` or ``mm(x, w.t())`` on CPU fp32 with
    at most T_MAX_ROWS rows, x row-major and ``w.t()`` the transpose of a row-major [N, K]; else None."""
    if is_call(n, aten.addmm.default, None, None, None):
        bias, x, wt = n.args
    elif is_call(n, aten.mm.default, None, None):
        (x, wt), bias = n.args, None
    else:
        return None
    out = n.meta.get("val")
    xv, wv = (getattr(a, "meta", {}).get("val") for a in (x, wt))
    if not (_static_2d(out) and _static_2d(xv) and _static_2d(wv)) or out.device.type != "cpu":
        return None
    (M, K), N = xv.shape, wv.shape[1]
    if not (0 < M <= T_MAX_ROWS and K > 0 and N > 0) or x is wt:
        return None
    if out.dtype != torch.float32 or xv.dtype != out.dtype or wv.dtype != out.dtype:
        return None
    if tuple(xv.stride()) != (K, 1) or tuple(wv.stride()) != (1, K) or tuple(out.stride()) != (N, 1):
        return None
    if bias is not None:
        bv = getattr(bias, "meta", {}).get("val")
        if not isinstance(bv, torch.Tensor) or bv.dtype != out.dtype or tuple(bv.shape) != (N,):
            return None
    return bias, x, wt


def _weight_is_input(wt) -> bool:
    """``wt`` is a transposing view of a placeholder or constant (what packed_linear packs)."""
    base = wt.args[0] if wt.op == "call_function" and wt.target in (aten.t.default, aten.permute.default) else None
    return base is not None and base.op in ("placeholder", "get_attr")


def small_linears(gm: torch.fx.GraphModule, packed: bool) -> list:
    """The nodes ``transpose_small_mm`` rewrites: ``_small_linear`` matches, and, with ``packed`` (the
    option packed_linear on), not those packed_linear takes."""
    from ember.native import packed_linear
    out = []
    for n in gm.graph.nodes:
        m = _small_linear(n)
        if m is None:
            continue
        bias, _, wt = m
        M, N = n.meta["val"].shape
        if packed and packed_linear.available() and _weight_is_input(wt) and packed_linear.claims(
                "addmm" if bias is not None else "mm", M, N):
            continue
        out.append(n)
    return out


def graph_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule over a copy of ``gm``'s graph (nodes and their meta), for rewrites the caller's
    graph must not see."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, graph)


def transpose_small_mm(gm: torch.fx.GraphModule, packed: bool) -> int:
    """``addmm(bias, x, w.t())`` -> ``mm(w, x.t()).t() + bias`` (``mm`` likewise, the last op then a
    ``clone`` to eager's row-major layout, which fuses into the consumers' kernels) where
    ``_small_linear`` matches; ``packed``: packed_linear is on, which keeps the calls it takes.
    Returns the count."""
    g, done = gm.graph, 0
    for n in small_linears(gm, packed):
        bias, x, wt = _small_linear(n)

        def node(target, args, val):
            new = g.call_function(target, args)
            new.meta = {**n.meta, "val": val}
            return new

        def t(a):  # (each value made from one tensor's: a graph's metadata may come from several fake modes)
            return node(aten.permute.default, (a, [1, 0]), a.meta["val"].permute(1, 0))
        with g.inserting_before(n):
            w = t(wt)  # [N, K], row-major
            M, N = n.meta["val"].shape
            yt = node(aten.mm.default, (w, t(x)), w.meta["val"].new_empty((N, M)))  # [N, M], row-major
            y = t(yt)  # [M, N], column-major
            if bias is not None:
                out = g.call_function(aten.add.Tensor, (y, bias))
            else:
                out = g.call_function(aten.clone.default, (y,), {"memory_format": torch.contiguous_format})
            out.meta = dict(n.meta)  # eager's result: row-major
        n.replace_all_uses_with(out)
        g.erase_node(n)
        done += 1
    if done:
        gm.recompile()
    return done
