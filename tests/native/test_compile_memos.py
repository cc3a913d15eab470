"""The native backend's compile-time memos and faster paths (issue 29: a 24-layer Llama's cold
compile) answer exactly what the plain computations answer: the recursive ``ir.walk`` visits in the
explicit-stack order (and falls back to it past the recursion limit), ``scheduler.place`` from its
cache equals placing afresh, cached write/read and loop-merge checks equal fresh ones, the Triton
emitter's memoized index text needs exactly the loop variables the index uses, and ``norm_sizes``'
all-int fast path keeps what ``norm`` does to other values."""
import random
import sys

import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.native import ir, lowering, scheduler, triton_emit
from ember.native.options import NativeOptions
from ember.native.symbolic import norm, norm_sizes, size_symbol


def _random_dag(rng, n=300):
    """Exprs sharing subtrees, with structurally equal copies made as distinct objects."""
    leaves = [ir.load(f"buf{i}", ir.sym("v0") + i, {}, torch.float32) for i in range(5)]
    leaves += [ir.const(float(i), torch.float32) for i in range(3)]
    pool = list(leaves)
    for _ in range(n):
        kind = rng.random()
        a, b = rng.choice(pool), rng.choice(pool)
        if kind < 0.4:
            e = ir.op("add", a, b)
        elif kind < 0.7:
            e = ir.op("mul", a, ir.op("neg", b))
        elif kind < 0.8:
            e = ir.Expr(a.op, a.args, a.dtype, a.attr)  # equal to a, another object
        else:
            e = ir.masked(ir.op("gt", a, b), a, 0.0)
        pool.append(e)
    return pool


def test_walk_matches_iterative_order():
    rng = random.Random(0)
    pool = _random_dag(rng)
    for _ in range(200):
        roots = [rng.choice(pool) for _ in range(rng.randint(1, 4))]
        assert ir.walk(roots) == ir._walk_iterative(roots)
        assert ir.walk(iter(roots)) == ir._walk_iterative(roots)  # (any iterable of roots)
    assert ir.walk([]) == []


def test_walk_deeper_than_the_recursion_limit():
    e = ir.load("buf", ir.sym("v0"), {}, torch.float32)
    for i in range(sys.getrecursionlimit() * 2):
        e = ir.op("add", e, ir.const(float(i % 7), torch.float32))
    order = ir.walk([e])
    assert order == ir._walk_iterative([e])
    assert order[-1] is e and len(order) == len(set(order))


def _block(x, w, b):
    h = torch.nn.functional.layer_norm(x, x.shape[-1:])
    h = torch.relu(h @ w + b) * torch.sigmoid(h)
    s = torch.softmax(h, -1) + h.mean(-1, keepdim=True)
    return (x + s).view(-1, x.shape[-1] * 2), s.sum(0)


def _graph():
    args = (torch.randn(8, 6, 16), torch.randn(16, 16), torch.randn(16))
    gm = make_fx(_block)(*args)
    g, _ = lowering.lower(gm, args, libdevice=True)
    return g


def test_place_cache_matches_fresh_placement():
    g = _graph()
    nodes = [n for n in g.nodes if isinstance(n, ir.ComputedNode)]
    spaces = {(tuple(n.ranges), tuple(n.reduced)) for n in nodes} | {((48, 16), (1,)), ((768,), ())}
    checked = 0
    for n in nodes:
        for ranges, reduced in spaces:
            for single in (False, True):
                fresh = scheduler._place(n, ranges, reduced, single)
                assert scheduler.place(n, ranges, reduced, single) == fresh
                assert scheduler.place(n, ranges, reduced, single) == fresh  # (from the cache)
                checked += fresh is not None
    assert checked  # (some nodes fit some spaces)


def test_cached_index_checks_match_fresh():
    v0, v1 = ir.node_vars(2)
    ranges = (6, 8)
    cases = [(8 * v0 + v1, (), 8 * v0 + v1, ()), (8 * v0 + v1, (), v1 + 8 * v0, ()),
             (v0, ((v0, v1),), v1, ()), (8 * v0 + v1, (), 8 * v1 + v0, ()),
             (ir.IMod(v1 + 8 * v0, 8) + 8 * ir.FloorDiv(v1 + 8 * v0, 8), (), v1 + 8 * v0, ())]
    for store, smap, index, lmap in cases:
        w, r = sympy.sympify(store).xreplace(dict(smap)), index.xreplace(dict(lmap))
        fresh = sympy.expand(w - r) == 0 or scheduler._same_index(w, r, ranges)
        for _ in range(2):
            assert scheduler._passes_in_registers(store, smap, index, lmap, ranges) == fresh
    s0 = size_symbol(0)
    for e in (8 * v0 + v1, 9 * v0 + v1, s0 * v0 + v1, v0 + v1, 8 * v0 + v1 + ir.FloorDiv(v1, 2)):
        for nq in (8, s0):
            assert scheduler._mergeable_index(e, v0, v1, nq) == scheduler._mergeable_index.__wrapped__(e, v0, v1, nq)


def test_loop_index_text_needs_its_variables():
    v = ir.node_vars(3)
    assert triton_emit._loop_vars_needed(set()) == 0
    assert triton_emit._loop_vars_needed({v[0], v[2]}) == 3
    assert triton_emit._loop_vars_needed({v[0], size_symbol(0)}) is None  # sizes are named per kernel
    assert triton_emit._loop_vars_needed({ir.sym("ind0")}) is None
    assert triton_emit._loop_vars_needed({sympy.Symbol("v1")}) is None  # not the loop variable v1


def test_norm_sizes_fast_path():
    assert norm_sizes(torch.Size([2, 3])) == (2, 3)
    assert norm_sizes([True, 4]) == (norm(True), 4) == (1, 4)
    assert norm_sizes((sympy.Integer(5), 2)) == (5, 2) and type(norm_sizes((sympy.Integer(5),))[0]) is int
    assert norm_sizes(()) == ()


def test_fused_schedule_unchanged_by_memos():
    """Two schedules of one graph, the second from warm caches, give the same kernels."""
    g = _graph()
    first = scheduler.schedule(g, NativeOptions())
    again = scheduler.schedule(_graph(), NativeOptions())
    assert [(type(s).__name__, getattr(s, "ranges", None), [n.name for n in getattr(s, "nodes", [])])
            for s in first.steps] == \
        [(type(s).__name__, getattr(s, "ranges", None), [n.name for n in getattr(s, "nodes", [])])
         for s in again.steps]


def test_buffers_read_memo_matches_walk():
    """GraphLowering._buffers_read (should_realize's read count for single-use values) from its memo
    equals the loads a walk finds, also for a body deeper than the recursion limit."""
    L = lowering.GraphLowering.__new__(lowering.GraphLowering)
    L._bufs_memo = {}
    rng = random.Random(1)
    pool = _random_dag(rng)
    for e in pool + pool:
        assert L._buffers_read(e) == {x.attr[0] for x in ir.walk([e]) if x.op == "load"}
    e = ir.load("deep0", ir.sym("v0"), {}, torch.float32)
    for i in range(sys.getrecursionlimit() * 2):
        e = ir.op("add", e, ir.load(f"deep{i % 11}", ir.sym("v0"), {}, torch.float32))
    assert L._buffers_read(e) == {f"deep{i}" for i in range(11)}
