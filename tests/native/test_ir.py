"""The IR layer on its own: index simplification, lowering to printable IR, the verifier, the
decomposition table, loop merging, extern fallbacks."""
import pytest
import torch

from ember.native import DECOMPOSITIONS, ir, lowering, scheduler
from tests.native.harness import trace

aten = torch.ops.aten
v0, v1 = ir.sym("v0"), ir.sym("v1")


def test_simplify_index_flatten_unflatten():
    r = {v0: 10, v1: 7}
    flat = 7 * v0 + v1
    assert ir.simplify_index(ir.FloorDiv(flat, 7), r) == v0
    assert ir.simplify_index(ir.IMod(flat, 7), r) == v1
    assert ir.simplify_index(ir.FloorDiv(v1, 8), r) == 0
    assert ir.simplify_index(ir.IMod(flat, 15), r) == ir.IMod(flat, 15)  # not provable: kept
    assert ir.simplify_index(ir.IMod(flat, 14), r) == 7 * ir.IMod(v0, 2) + v1  # the common factor 7
    assert ir.bounds(3 * v0 - v1 + 2, r) == (-4, 29)


def test_simplify_index_memo_keys_on_ranges_and_lower_bounds():
    """simplify_index remembers its answers (issue 29: every layer of a deep model asks the same
    questions); an answer holds for its ranges and lower bounds only."""
    from ember.native import symbolic
    flat = 8 * v0 + v1
    assert ir.simplify_index(ir.FloorDiv(flat, 8), {v0: 4, v1: 8}) == v0
    assert ir.simplify_index(ir.FloorDiv(flat, 8), {v0: 4, v1: 8}) == v0  # (answered from the memo)
    wide = ir.simplify_index(ir.FloorDiv(flat, 8), {v0: 4, v1: 16})  # v1 may reach 15: not v0
    assert wide != v0 and wide.has(ir.FloorDiv)
    s = symbolic.size_symbol(0)
    assert ir.simplify_index(ir.FloorDiv(v1, s), {v1: 8}) != 0  # s may be small
    assert ir.simplify_index(ir.FloorDiv(v1, s), {v1: 8}, lower={s: 8}) == 0  # s >= 8 > v1
    assert any(k[0] == ir.FloorDiv(flat, 8) for k in symbolic._SIMPLIFIED)
    symbolic._SIMPLIFIED.clear()
    assert ir.simplify_index(ir.FloorDiv(flat, 8), {v0: 4, v1: 8}) == v0


def test_expr_structural_equality_and_rename():
    a = ir.load("buf0", 7 * v0 + v1, {}, torch.float32)
    b = ir.load("buf0", 7 * v0 + v1, {}, torch.float32)
    assert a == b and hash(a) == hash(b)
    e = ir.op("add", a, ir.const(1.0, torch.float32))
    renamed = ir.rename(e, {v0: v1, v1: v0})
    assert renamed.args[0].attr[1] == 7 * v1 + v0
    assert ir.opcount(e) == 1 and ir.loads_of(e) == [a]
    assert ir.const(float("nan"), torch.float32) == ir.const(float("nan"), torch.float32)


def test_signed_zero_constants_are_distinct():
    # -0.0 == 0.0 and they hash alike: as one Expr, x * 0 + -0.0 (which keeps x * 0's sign) became
    # x * 0 + 0.0 (which does not), and 1 / that gave inf where eager gives -inf
    assert ir.const(-0.0, torch.float32) != ir.const(0.0, torch.float32)
    assert ir.const(-0.0, torch.float32) == ir.const(-0.0, torch.float32)
    import ember
    x = torch.tensor([-1.0, 2.0, -3.0])
    fn = lambda x: 1 / (x * 0 + -0.0)  # noqa: E731
    ember.reset()
    torch.testing.assert_close(ember.compile(fn)(x), fn(x))
    assert torch.equal(torch.signbit(ember.compile(fn)(x)), torch.signbit(fn(x)))


def _lower(fn, *inputs):
    gm = trace(fn, list(inputs))
    g, _ = lowering.lower(gm, list(inputs))
    return g


def test_lowering_prints_and_verifies():
    g = _lower(lambda x: torch.softmax(x, -1), torch.randn(4, 6))
    text = g.format()
    assert "max over ranges [4, 6] reducing [1]" in text
    assert "sum over ranges [4, 6] reducing [1]" in text
    assert "exp(sub(load(arg0, 6*v0 + v1), load(buf0, v0)))" in text
    ir.verify(g)


def test_views_are_index_remaps_not_copies():
    g = _lower(lambda x: (x.t() * 2).sum(0), torch.randn(4, 6))
    computed = [n for n in g.nodes if isinstance(n, ir.ComputedNode)]
    assert len(computed) == 1 and computed[0].is_reduction
    # x.t()[i, j] = x[j, i]; the loops follow x's memory order: v0 = j (kept), v1 = i (reduced)
    assert "load(arg0, 6*v0 + v1)" in ir.format_expr(computed[0].body)
    assert computed[0].ranges == (4, 6) and computed[0].reduced == (1,)


def test_verifier_rejects_bad_ir():
    g = _lower(lambda x: x + 1, torch.randn(4, 6))
    node = g.nodes[0]
    bad = ir.load("nowhere", v0, {}, torch.float32)
    g.nodes[0] = ir.ComputedNode(node.name, node.layout, node.ranges, bad, node.store_index)
    with pytest.raises(ir.IRError, match="unknown buffer"):
        ir.verify(g)
    oob = ir.load("arg0", 100 * v0, {}, torch.float32)
    g.nodes[0] = ir.ComputedNode(node.name, node.layout, node.ranges, oob, node.store_index)
    with pytest.raises(ir.IRError, match="out of bounds"):
        ir.verify(g)


def test_unlowered_op_becomes_extern():
    g = _lower(lambda x: torch.cumsum(x, 0) + 1, torch.randn(4, 6))
    ext = [n for n in g.nodes if isinstance(n, ir.ExternNode)]
    assert [str(e.target) for e in ext] == ["aten.cumsum.default"]
    assert "no lowering" in ext[0].reason
    assert "extern aten.cumsum.default" in g.format()


def test_matmul_is_extern_by_design():
    g = _lower(lambda x, w: torch.relu(x @ w), torch.randn(4, 6), torch.randn(6, 3))
    ext = [n for n in g.nodes if isinstance(n, ir.ExternNode)]
    assert [str(e.target) for e in ext] == ["aten.mm.default"] and ext[0].reason == ""


def test_decomposition_table():
    assert aten._softmax.default in DECOMPOSITIONS
    assert aten.native_layer_norm.default in DECOMPOSITIONS
    assert aten.gelu.default in DECOMPOSITIONS
    for kept in (aten.addmm.default, aten.mm.default, aten.convolution.default, aten.var_mean.correction):
        assert kept not in DECOMPOSITIONS


def test_merge_loops_flattens_contiguous_dims():
    g = _lower(lambda x: x.exp() * 2, torch.randn(4, 6))
    sched = scheduler.schedule(g)
    (k,) = [s for s in sched.steps if isinstance(s, scheduler.Kernel)]
    assert k.ranges == (24,)
    g2 = _lower(lambda x, b: x + b, torch.randn(4, 6), torch.randn(6))  # the bias blocks merging
    (k2,) = [s for s in scheduler.schedule(g2).steps if isinstance(s, scheduler.Kernel)]
    assert k2.ranges == (4, 6)


def test_scheduler_local_buffers_and_report():
    g = _lower(lambda x: torch.softmax(x, -1), torch.randn(4, 6))
    sched = scheduler.schedule(g)
    (k,) = sched.steps
    assert len(k.local) == 2 and k.writes == [g.outputs[0].name if isinstance(g.outputs, tuple) else g.outputs.name]
    assert sched.report["bytes"] == 2 * 4 * 6 * 4


def test_simplify_index_common_factor():
    # [B*T, C] -> [B, T, C] -> [B*T, C] reads (C*v0 + v1) // (T*C): a common factor C, remainder < C
    r = {v0: 4096, v1: 768}
    assert ir.simplify_index(ir.FloorDiv(768 * v0 + v1, 393216), r) == ir.FloorDiv(v0, 512)
    assert ir.simplify_index(ir.IMod(768 * v0 + v1, 393216), r) == 768 * ir.IMod(v0, 512) + v1
    # and the whole view index folds back to the plain row-major one
    e = v1 + 393216 * ir.FloorDiv(768 * v0 + v1, 393216) + 768 * ir.IMod(v0, 512)
    assert ir.simplify_index(e, r) == 768 * v0 + v1
    assert ir.simplify_index(ir.FloorDiv(6 * v0 + v1, 4), r) == ir.FloorDiv(6 * v0 + v1, 4)  # v1 may reach 2


def test_reshape_map_between_loop_nests():
    k0, k1, k2 = ir.node_vars(3)
    m = scheduler.reshape_map([v0, v1], (12, 32), [k0, k1, k2], (2, 6, 32))
    assert m == {v0: 6 * k0 + k1, v1: k2}
    back = scheduler.reshape_map([k0, k1, k2], (2, 6, 32), [v0, v1], (12, 32))
    known = {v0: 12, v1: 32}
    assert {k: ir.simplify_index(e, known) for k, e in back.items()} == {k0: ir.FloorDiv(v0, 6), k1: ir.IMod(v0, 6),
                                                                           k2: v1}
    assert scheduler.reshape_map([v0], (10,), [k0], (12,)) is None


def test_index_through_reshape_map_joins_back():
    # a channels-last [64, 56, 56, 256] node fused into a split column reduction over
    # [28 splits, 7168 rows, 256 channels] (ResNet-50's batch-norm backward): its address, rebuilt
    # from the kernel's flat position digit by digit, is the kernel's own row-major address
    k0, k1, k2 = ir.node_vars(3)
    n, h, w, c = ir.node_vars(4)
    m = scheduler.reshape_map([n, h, w, c], (64, 56, 56, 256), [k0, k1, k2], (28, 7168, 256))
    index = (802816 * n + 14336 * h + 256 * w + c).xreplace(m)
    assert ir.simplify_index(index, {k0: 28, k1: 7168, k2: 256}) == 1835008 * k0 + 256 * k1 + k2
    # the join alone, on digits of one number; digits of different numbers stay apart
    x = k0 + 7 * k1
    digits = 12 * ir.FloorDiv(x, 12) + 4 * ir.IMod(ir.FloorDiv(x, 4), 3) + ir.IMod(x, 4)
    assert ir.simplify_index(digits, {k0: 7, k1: 100}) == x
    apart = 12 * ir.FloorDiv(x, 12) + 4 * ir.IMod(ir.FloorDiv(k1, 4), 3) + ir.IMod(x, 4)
    assert ir.simplify_index(apart, {k0: 7, k1: 100}).has(ir.FloorDiv)
