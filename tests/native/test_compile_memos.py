"""The native backend's compile-time memos and faster paths (issue 29: a 24-layer Llama's cold
compile) answer exactly what the plain computations answer: the recursive ``ir.walk`` visits in the
explicit-stack order (and falls back to it past the recursion limit), ``scheduler.place`` from its
cache equals placing afresh, cached write/read and loop-merge checks equal fresh ones, the Triton
emitter's memoized index text needs exactly the loop variables the index uses, and ``norm_sizes``'
all-int fast path keeps what ``norm`` does to other values; and a whole compile (forward, and forward
and backward) writes byte for byte the same wrapper and Triton kernels with every memo bypassed."""
import random
import sys

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.native import ir, lower_ops, lowering, passes, scheduler, symbolic, triton_emit
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


# ------------------------------------------------------------- a whole compile, memos on and off

class _Counting(dict):
    """A module-level memo that counts its hits (``get`` is how every memo here is read)."""
    hits = 0

    def get(self, key, default=None):
        hit = dict.get(self, key)
        if hit is not None:
            self.hits += 1
            return hit
        return default


class _Forgetful(dict):
    """A module-level memo that never remembers: every answer is computed afresh."""

    def get(self, key, default=None):
        return default

    def __setitem__(self, key, value):
        pass


# (module, name) of the memos kept in module-level dicts, and of the lru_caches
_DICT_MEMOS = [(ir, "_INDIRECT_OF"), (lowering, "_STORED_INDEX"), (lowering, "_OP_NAMES"), (passes, "_PURE"),
               (triton_emit, "_LOOP_INDEX_TEXT"), (triton_emit, "_FREE_SYMBOLS"), (symbolic, "_SIMPLIFIED"),
               (lower_ops, "_DTYPES")]
_LRU_MEMOS = [(lowering, "_last_frame"), (scheduler, "_reshape_map"), (scheduler, "_placed"),
              (scheduler, "_passes_in_registers"), (scheduler, "_mergeable_index")]


def _memos_off(monkeypatch):
    """Every compile-time memo bypassed: module dicts that forget, the lru_caches' plain functions,
    and the per-graph memos of GraphLowering (origins, resolve_indirect, should_realize's reads)
    back to their plain computations."""
    for mod, name in _DICT_MEMOS:
        monkeypatch.setattr(mod, name, _Forgetful())
    for mod, name in _LRU_MEMOS:
        monkeypatch.setattr(mod, name, getattr(mod, name).__wrapped__)
    init = lowering.GraphLowering.__init__

    def plain_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._origin_of = _Forgetful()
    monkeypatch.setattr(lowering.GraphLowering, "__init__", plain_init)
    monkeypatch.setattr(lowering.GraphLowering, "_resolve", lambda self, e: ir.resolve_indirect(e, self.indirect))
    monkeypatch.setattr(lowering.GraphLowering, "_buffers_read",
                        lambda self, e: frozenset(x.attr[0] for x in ir.walk([e]) if x.op == "load"))


def _memos_counted(monkeypatch) -> dict:
    """Every module-level memo and lru_cache emptied, the dicts counting hits: name -> hits so far."""
    counting = {}
    for mod, name in _DICT_MEMOS:
        counting[name] = _Counting()
        monkeypatch.setattr(mod, name, counting[name])
    for mod, name in _LRU_MEMOS:
        getattr(mod, name).cache_clear()
    init = lowering.GraphLowering.__init__

    def counted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._origin_of = counting.setdefault("_origin_of", _Counting())
        self._bufs_memo = counting.setdefault("_bufs_memo", _Counting())
    monkeypatch.setattr(lowering.GraphLowering, "__init__", counted_init)

    def hits():
        out = {name: d.hits for name, d in counting.items()}
        out.update({name: getattr(mod, name).cache_info().hits for mod, name in _LRU_MEMOS})
        return out
    return hits


class _Layer(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 2 * d)
        self.fc2 = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.fc2(torch.nn.functional.gelu(self.fc(self.ln(x))))
        return x + torch.softmax(h, -1) * h


class _Model(torch.nn.Module):
    def __init__(self, d=16, n=3):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Layer(d) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return torch.softmax(x.view(2, -1), -1)  # (a view the fusion maps through: reshape_map)


def _compile_sources(monkeypatch, tmp_path, train: bool) -> list:
    """The wrapper and kernel sources of every graph of a fresh compile of _Model (Triton code, run in
    the interpreter on CPU), checked against eager."""
    import functools

    import ember
    from ember.aot import aot_autograd
    from ember.config import config
    from ember.native import backend, compile_aten_graph
    from ember.native.decomp import AOT_DECOMPOSITIONS

    sources = []
    emit = backend._emit_log

    def record(wrapper_src, kernel_srcs):
        sources.append((wrapper_src, list(kernel_srcs)))
        emit(wrapper_src, kernel_srcs)
    monkeypatch.setattr(backend, "_emit_log", record)
    monkeypatch.setattr(config, "aot_cache", False)
    monkeypatch.setattr(config, "frontend_cache", False)
    native = functools.partial(compile_aten_graph, force_triton=True,
                               options={"cache": False, "cache_dir": str(tmp_path)})
    ember.reset()
    torch.manual_seed(0)
    m = _Model()
    x = torch.randn(2, 8, 16, requires_grad=train)
    cm = ember.compile(m, backend=aot_autograd(fw_compiler=native, bw_compiler=native, inference_compiler=native,
                                               decompositions=AOT_DECOMPOSITIONS))
    if train:
        out = cm(x)
        out.square().sum().backward()
        grads = [p.grad for p in m.parameters()] + [x.grad]
        m.zero_grad()
        x.grad = None
        ref = m(x)
        ref.square().sum().backward()
        for g, r in zip(grads, [p.grad for p in m.parameters()] + [x.grad]):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    else:
        with torch.no_grad():
            out, ref = cm(x), m(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert len(sources) == (2 if train else 1), len(sources)
    return sources


@pytest.mark.parametrize("train", [False, True])
def test_generated_code_the_same_without_memos(train, monkeypatch, tmp_path):
    """A compile of a small repeated-layer model (matmuls, layer norm, gelu, softmax; forward, and
    forward and backward) with every compile-time memo bypassed writes byte for byte the wrapper and
    kernels that it writes with the memos on, and the memos on were used (hits, from the layers
    repeating)."""
    with monkeypatch.context() as mp:
        hits = _memos_counted(mp)
        on = _compile_sources(mp, tmp_path, train)
        got = hits()
    with monkeypatch.context() as mp:
        _memos_off(mp)
        off = _compile_sources(mp, tmp_path, train)
    assert [w for w, _ in on] == [w for w, _ in off]
    assert [k for _, k in on] == [k for _, k in off]
    assert sum(len(k) for _, k in on) >= 3
    # (no stack traces reach the ATen graphs here: _last_frame is not asked; the forward alone has
    # no fusion through a view of another shape)
    unused = {"_last_frame"} | (set() if train else {"_reshape_map"})
    assert all(got[name] > 0 for name in got if name not in unused), got
