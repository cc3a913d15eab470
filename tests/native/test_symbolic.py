"""Size and index arithmetic with symbolic sizes (ember/native/symbolic.py): proofs are sound (checked
against brute force over many sizes), simplifications hold for every size, ShapeEnv expressions
translate to the backend's size symbols."""
import itertools

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.native import ir
from ember.native.symbolic import (FloorDiv, IMod, SizeVars, SymbolicUnsupported, active, bounds, known_nonneg,
                                   node_vars, norm, print_expr, simplify_index, size_symbol)

s0, s1 = size_symbol(0), size_symbol(1)
v0, v1, v2 = node_vars(3)


def _values(expr, env):
    return int(sympy.sympify(expr).xreplace({k: sympy.Integer(v) for k, v in env.items()}))


@pytest.mark.parametrize("expr,lower,provable", [
    (s0 - 2, {s0: 2}, True),
    (s0 - 3, {s0: 2}, False),
    (s0 * s1 - s1, {s0: 1}, True),
    (FloorDiv(s0, 2) - 1, {s0: 2}, True),            # monotone: smallest at the lower bound
    (s0 - FloorDiv(s0 + 2, 3), {s0: 1}, True),       # FloorDiv replaced by its upper bound
    (s0 - 2 * FloorDiv(s0 + 2, 3), {s0: 2}, False),  # 2 - 2*1 = 0 holds, 4 - 2*2 = 0... but 3 - 2*1 = 1;
    (v0 - 1, {}, False),                             # loop variables are not sizes
])
def test_known_nonneg_is_sound(expr, lower, provable):
    assert known_nonneg(expr, lower) == provable
    if provable:  # brute force: true at every size allowed by the lower bounds
        for a, b in itertools.product(range(lower.get(s0, 0), 40), range(lower.get(s1, 0), 12)):
            assert _values(expr, {s0: a, s1: b}) >= 0


def test_simplify_index_with_symbolic_sizes():
    # [B, S, H] viewed as [B*S, H] and back, S symbolic: the flatten-unflatten pairs cancel
    r = {v0: 2 * s0, v1: 32}
    flat = 32 * v0 + v1
    assert simplify_index(FloorDiv(flat, 32 * s0), r) == FloorDiv(v0, s0)
    assert simplify_index(IMod(FloorDiv(flat, 32), s0), r) == IMod(v0, s0)
    r3 = {v0: 2, v1: s0, v2: 32}
    flat3 = 32 * s0 * v0 + 32 * v1 + v2
    assert simplify_index(FloorDiv(flat3, 32), r3) == s0 * v0 + v1
    # d*(x // d) + x % d folds back into x
    assert simplify_index(s0 * FloorDiv(v0, s0) + IMod(v0, s0), {v0: 4 * s0}) == v0
    # not provable: kept
    assert simplify_index(FloorDiv(v0 + v1, s0), {v0: s0, v1: s0}) == FloorDiv(v0 + v1, s0)


def test_simplifications_hold_for_every_size():
    for e, r in [(FloorDiv(32 * v0 + v1, 32 * s0), {v0: 2 * s0, v1: 32}),
                 (IMod(FloorDiv(5 * s0 * v0 + 5 * v1 + v2, 5), s0), {v0: 3, v1: s0, v2: 5}),
                 (s0 * FloorDiv(v0, s0) + IMod(v0, s0), {v0: 4 * s0})]:
        simple = simplify_index(e, r)
        for n in range(1, 7):
            ranges = [range(int(sympy.sympify(x).subs(s0, n))) for x in r.values()]
            for point in itertools.product(*ranges):
                env = {**dict(zip(r, point)), s0: n}
                assert _values(simple, env) == _values(e, env), (e, simple, env)


def test_bounds_with_symbolic_ranges():
    assert bounds(s0 * v0 + v1, {v0: 3, v1: s0}) == (0, 3 * s0 - 1)
    lo, hi = bounds(IMod(v0, s0), {v0: 4 * s0})
    assert (lo, hi) == (0, s0 - 1)
    assert bounds(v0 * v1, {v0: s0, v1: s1}) == (0, (s0 - 1) * (s1 - 1))


def test_print_expr_for_triton_and_python():
    names = {v0: "v0", v1: "v1"}
    e = s0 * v0 + FloorDiv(v1, 8 * s1) + IMod(v1, s1)
    text = print_expr(e, lambda s: names.get(s, s.name))
    assert "(v1) // (8*s1)" in text and "(v1) % s1" in text
    for a, b, c, d in itertools.product(range(4), range(1, 3), range(40), range(1, 5)):
        assert eval(text, {"s0": b, "v0": a, "v1": c, "s1": d}) == _values(e, {s0: b, v0: a, v1: c, s1: d})
    assert print_expr(s0 ** 2, str) == "s0*s0"
    with pytest.raises(NotImplementedError):
        print_expr(s0 / 2, str)


def _traced_sizes(f, *inputs):
    gm = make_fx(f, tracing_mode="symbolic")(*inputs)
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    x = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"]
    return x, [o.meta["val"] for o in out]


def test_shape_env_expressions_translate():
    x, vals = _traced_sizes(lambda x: (x.view(-1, 8), x[2:], x.new_zeros(torch.sym_max(x.shape[0] - 1, 1))),
                            torch.randn(32))
    sv = SizeVars()
    with active(sv):
        x_size = norm(x.shape[0])
        assert x_size == size_symbol(0) and sv.hints[x_size] == 32 and sv.lower[x_size] >= 2
        assert norm(vals[0].shape[0]) == FloorDiv(x_size, 8)
        assert norm(vals[1].shape[0]) == x_size - 2
        assert norm(vals[2].shape[0]) == x_size - 1  # Max(1, s0 - 1) with s0 >= 2
    assert "s0 = ?  # hint 32" in sv.describe()
    with pytest.raises(SymbolicUnsupported):
        norm(vals[0].shape[0])  # outside a lowering


def test_max_and_min_stay_unsupported_when_the_ranges_do_not_decide():
    x, vals = _traced_sizes(lambda x: (x.new_zeros(torch.sym_min(x.shape[0], 13)),), torch.randn(20))
    with active(SizeVars()), pytest.raises(SymbolicUnsupported, match="Min"):
        norm(vals[0].shape[0])


def test_verifier_wants_every_symbol_read_from_an_input():
    lay = ir.Layout((s0,), (1,), torch.float32, torch.device("cpu"))
    g = ir.GraphIR([ir.InputBuffer("arg0", lay, index=0)], [], ir.OutBuf("arg0", (s0,), (1,), 0))
    g.sizevars.hints[s0], g.sizevars.lower[s0], g.sizevars.upper[s0] = 4, 2, None
    with pytest.raises(ir.IRError, match="read from no input"):
        ir.verify(g)
    g.sizevars.bind(s0, "arg0.size(0)")
    ir.verify(g)
