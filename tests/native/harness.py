"""Compile-and-compare for the native backend: trace with make_fx + DECOMPOSITIONS, compile with
Triton forced, run with poisoned buffers, compare with eager.

Poisoning: every buffer the wrapper allocates is a view into a larger buffer whose guard regions
(before and after) and interior start filled with a sentinel; after the call the guards must be
intact (no out-of-bounds write) and outputs must match eager (so no element was left unwritten).
Inputs are views into NaN-filled buffers too, so an out-of-bounds read shows up as a NaN.
"""
from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from ember.native import DECOMPOSITIONS, cache, compile_aten_graph

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GUARD = 64
TOL = {torch.float32: (1e-5, 1.3e-5), torch.float64: (1e-7, 1e-7), torch.float16: (2e-3, 2e-3),
       torch.bfloat16: (1.6e-2, 1.6e-2)}


def _sentinel(dtype):
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point:
        return -7.25e3 if dtype != torch.float16 else -7.25e2
    return -77


class GuardedAllocator:
    """Replaces the wrapper's ``empty_strided``: hands out poisoned views and checks the guards."""

    def __init__(self):
        self.allocs = []

    def __call__(self, size, stride, device=None, dtype=None):
        n = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(s > 0 for s in size) else 0
        base = torch.full((GUARD + n + GUARD,), _sentinel(dtype), dtype=dtype, device=device)
        self.allocs.append((base, n))
        return base.as_strided(tuple(size), tuple(stride), GUARD)

    def check(self):
        for base, n in self.allocs:
            s = _sentinel(base.dtype)
            for region in (base[:GUARD], base[GUARD + n:]):
                assert bool((region == s).all()), "a kernel wrote outside its buffer (guard region changed)"


@contextlib.contextmanager
def guarded(compiled):
    """Route the wrapper module's allocations through a GuardedAllocator for one call."""
    path = compiled.ember_native.get("wrapper")
    if not path:
        yield None
        return
    mod = cache.load_module(path)
    alloc = GuardedAllocator()
    old = mod.empty_strided
    mod.empty_strided = alloc
    try:
        yield alloc
    finally:
        mod.empty_strided = old


def padded(t: torch.Tensor) -> torch.Tensor:
    """t's values in a view surrounded by NaN (or sentinel) guards, same sizes and strides."""
    if not isinstance(t, torch.Tensor):
        return t
    n = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    fill = float("nan") if t.dtype.is_floating_point else _sentinel(t.dtype)
    base = torch.full((GUARD + n + GUARD,), fill, dtype=t.dtype, device=t.device)
    v = base.as_strided(t.shape, t.stride(), GUARD)
    v.copy_(t)
    return v


def trace(fn, inputs, tracing_mode="fake"):
    """``tracing_mode="symbolic"``: every dimension of size >= 2 becomes a size symbol (dynamic shapes)."""
    from torch.func import functionalize
    def flat(*args):  # fixes the arity (F.silu & co. have optional parameters)
        return fn(*args)
    return make_fx(functionalize(flat), decomposition_table=DECOMPOSITIONS, tracing_mode=tracing_mode,
                   record_stack_traces=True)(*inputs)


def run_case(fn, inputs, *, options=None, atol=None, rtol=None, cache_dir=None, check_strides=True):
    """Compile fn for inputs, run it guarded, compare with eager. Returns the compiled callable."""
    inputs = [padded(x) for x in inputs]
    ref = fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    gm = trace(fn, inputs)
    opts = dict(options or {})
    if cache_dir:
        opts["cache_dir"] = cache_dir
    compiled = compile_aten_graph(gm, inputs, force_triton=True, options=opts)
    assert compiled.ember_native.get("reason") is None, compiled.ember_native.get("reason")
    with guarded(compiled) as alloc:
        out = compiled(*inputs)
    if alloc is not None:
        alloc.check()
    compare(out, ref, atol, rtol, check_strides)
    return compiled


def compare(out, ref, atol=None, rtol=None, check_strides=True):
    outs, _ = pytree.tree_flatten(out)
    refs, _ = pytree.tree_flatten(tuple(ref) if isinstance(ref, (list, tuple)) else (ref,))
    assert len(outs) == len(refs), (len(outs), len(refs))
    for o, r in zip(outs, refs):
        if not isinstance(r, torch.Tensor):
            assert o == r
            continue
        a, rt = TOL.get(r.dtype, (0, 0))
        torch.testing.assert_close(o, r, atol=atol if atol is not None else a, rtol=rtol if rtol is not None else rt,
                                   equal_nan=True)
        if check_strides and r.numel() > 1 and _dense(r):
            assert _same_strides(o, r), f"strides {o.stride()} != eager {r.stride()} for shape {tuple(r.shape)}"


def _dense(t):
    dims = sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1)
    acc = 1
    for st, s in dims:
        if st != acc:
            return False
        acc *= s
    return True


def _same_strides(a, b):
    return all(s == 1 or x == y for s, x, y in zip(b.shape, a.stride(), b.stride()))


def bn_relu_training_case():
    """(fn, inputs): forward and backward of a training batch norm + relu on a channels_last
    activation (4x8x6x6), as one graph returning the output and the three gradients."""
    import torch.nn.functional as F
    torch.manual_seed(0)
    cl = torch.channels_last
    x = torch.randn(4, 8, 6, 6, device=DEVICE).to(memory_format=cl)
    w, b = torch.randn(8, device=DEVICE), torch.randn(8, device=DEVICE)
    grad = torch.randn(4, 8, 6, 6, device=DEVICE).to(memory_format=cl)

    def fn(x, w, b, grad):
        y, vjp = torch.func.vjp(lambda x, w, b: F.relu(F.batch_norm(x, None, None, w, b, training=True)), x, w, b)
        return (y,) + tuple(vjp(grad))
    return fn, [x, w, b, grad]
