"""The reinplacing pass used when ATen graphs are run eagerly: it must only reuse buffers nobody can
observe, and running the rewritten graph must give the functional graph's results."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.aot.reinplace import reinplace

aten = torch.ops.aten


def _trace(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _check_same_results(fn, *args):
    gm = _trace(fn, *args)
    expected = gm(*[a.clone() for a in args])
    count = reinplace(gm)
    inputs = [a.clone() for a in args]
    got = gm(*inputs)
    for e, g in zip(expected if isinstance(expected, (tuple, list)) else [expected],
                    got if isinstance(got, (tuple, list)) else [got]):
        torch.testing.assert_close(g, e)
    for a, b in zip(args, inputs):
        torch.testing.assert_close(b, a)  # inputs are never overwritten
    return gm, count


def test_dead_intermediate_is_reused():
    gm, count = _check_same_results(lambda x: ((x * 2).sin() + 1).exp(), torch.randn(4, 4))
    assert count == 3
    assert aten.sin_.default in _targets(gm) and aten.exp_.default in _targets(gm)


def test_inputs_and_their_views_are_never_overwritten():
    gm, count = _check_same_results(lambda x: (x.t().sin(), x.sin()), torch.randn(3, 3))
    assert count == 0


def test_buffer_read_later_is_not_overwritten():
    def f(x):
        a = x * 2
        b = a.cos()      # may not overwrite a: read below
        return b + a
    gm, _ = _check_same_results(f, torch.randn(5))
    assert aten.cos.default in _targets(gm)


def test_view_read_later_blocks_overwriting_its_base():
    def f(x):
        a = x * 2
        v = a.view(-1)
        b = a.neg()      # a dies here, but its view v is read afterwards
        return b, v.sum()
    gm, _ = _check_same_results(f, torch.randn(2, 3))
    assert aten.neg.default in _targets(gm)


def test_overlapping_argument_blocks_overwriting():
    def f(x):
        a = x * 1.5
        return a + a.t()   # in place, a.t() would read values already overwritten
    gm, _ = _check_same_results(f, torch.randn(4, 4))
    assert aten.add.Tensor in _targets(gm)


def test_commutative_op_overwrites_its_dead_second_operand():
    def f(x, w):
        return w + (x * 3)     # w is an input, cannot be overwritten; the fresh product can
    gm, _ = _check_same_results(f, torch.randn(3, 3), torch.randn(3, 3))
    assert aten.add_.Tensor in _targets(gm)


def test_broadcasting_or_promotion_is_not_reinplaced():
    def f(x, y, z):
        return (x * 1) + y, (x * 2) - z   # (3,1)+(3,4) broadcasts; f32 - f64 promotes
    gm, _ = _check_same_results(f, torch.randn(3, 1), torch.randn(3, 4), torch.randn(3, 1, dtype=torch.float64))
    assert aten.add_.Tensor not in _targets(gm) and aten.sub_.Tensor not in _targets(gm)


def test_random_ops_are_left_out_of_place():
    gm = _trace(lambda x: torch.bernoulli(x * 0 + 0.5), torch.rand(4))
    reinplace(gm)
    assert aten.bernoulli_.float not in _targets(gm) and aten.bernoulli.default in _targets(gm)
