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
"""
from __future__ import annotations

import math

import torch

from ember.native import lowering
from ember.native.fx_match import gelu_of, is_call

aten = torch.ops.aten

# smallest number of rows (M) of an addmm rewritten (below it, packed_linear.RULES: MKL packed GEMM)
MIN_ROWS = 129
DTYPES = (torch.float32, torch.float64)  # (ATen's CPU _addmm_activation: what eager's encoder uses)
VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)  # (commute with an activation)


def _activation(n):
    """(node computing act(n), nodes of the activation to remove, use_gelu) or None."""
    relu = [u for u in n.users if is_call(u, aten.relu.default, n)]
    if relu and len(n.users) == 1:
        return relu[0], [], False
    gelu = gelu_of(n)
    if gelu is not None and all(u in gelu[1] for u in n.users):
        return gelu[0], gelu[1], True
    return None


def fuse_activations(gm: torch.fx.GraphModule) -> int:
    """``act(addmm(bias, x, w))`` -> ``_addmm_activation(bias, x, w, use_gelu=...)`` for CPU addmms of
    MIN_ROWS rows or more whose result feeds only the activation. Returns the count."""
    g, fused = gm.graph, 0
    for n in list(g.nodes):
        if not _big_addmm(n):
            continue
        out = n.meta["val"]
        views, pre = [], n  # a 3-D Linear's result is viewed back to 3-D before its activation
        while len(pre.users) == 1 and next(iter(pre.users)).target in VIEWS:
            pre = next(iter(pre.users))
            views.append(pre)
        match = _activation(pre)
        if match is None:
            continue
        act, inner, use_gelu = match
        if act.meta.get("val") is None or act.meta["val"].dtype != out.dtype:
            continue
        with g.inserting_before(act):
            new = g.call_function(aten._addmm_activation.default, tuple(n.args), {"use_gelu": use_gelu})
            new.meta = dict(n.meta)
            for v in views:  # the same views, now of the activation's result
                new = g.call_function(v.target, (new, *v.args[1:]), dict(v.kwargs))
                new.meta = dict(v.meta)
        act.replace_all_uses_with(new)
        for dead in [act, *reversed(inner), *reversed(views), n]:
            g.erase_node(dead)
        fused += 1
    if fused:
        gm.recompile()
    return fused


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
