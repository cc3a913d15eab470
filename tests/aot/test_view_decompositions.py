"""ember.aot.ops.FAST_VIEW_DECOMPOSITIONS: the transposes' one-dispatch decompositions trace the graph
torch's references trace (same ops, arguments and results), for every rank and dim spelling."""
import pytest
import torch
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from ember.aot import ops

aten = torch.ops.aten


def _graph(fn, table, x):
    gm = make_fx(fn, decomposition_table=table)(x)
    return [(n.op, str(n.target), tuple(str(a) for a in n.args)) for n in gm.graph.nodes], gm


def _reference_table():
    return {op: f for op, f in core_aten_decompositions().items()
            if op in (aten.t.default, aten.transpose.int, aten.permute.default)}


CASES = [
    ((), lambda x: x.t()),
    ((5,), lambda x: x.t()),
    ((3, 4), lambda x: x.t()),
    ((3, 4), lambda x: torch.transpose(x, 0, 1)),
    ((3, 4), lambda x: torch.transpose(x, -1, 1)),   # same dim spelled twice: identity permute, as the reference
    ((3, 4), lambda x: torch.transpose(x, 1, 1)),    # alias
    ((2, 3, 4), lambda x: x.transpose(-1, -2)),
    ((2, 3, 4, 5), lambda x: x.transpose(1, 3) * 2),
    ((5,), lambda x: x.transpose(0, -1)),
    ((), lambda x: x.transpose(0, -1)),
]


@pytest.mark.parametrize("shape,fn", CASES)
def test_same_graph_as_the_reference(shape, fn):
    x = torch.randn(shape)
    ours, gm = _graph(fn, dict(ops.FAST_VIEW_DECOMPOSITIONS), x)
    ref, ref_gm = _graph(fn, _reference_table(), x)
    assert ours == ref
    assert any(n.op == "call_function" for n in gm.graph.nodes)
    assert not any(n.target in (aten.t.default, aten.transpose.int) for n in gm.graph.nodes)
    out, want = gm(x), fn(x)
    assert out.shape == want.shape and out.stride() == want.stride() and torch.equal(out, want)


def test_errors_as_eager():
    with pytest.raises(RuntimeError, match="expects a tensor with <= 2 dimensions"):
        make_fx(lambda x: x.t(), decomposition_table=dict(ops.FAST_VIEW_DECOMPOSITIONS))(torch.randn(2, 3, 4))
    with pytest.raises(IndexError):
        make_fx(lambda x: x.transpose(0, 3), decomposition_table=dict(ops.FAST_VIEW_DECOMPOSITIONS))(torch.randn(2, 3))


def test_tables_use_them():
    from ember.native.decomp import AOT_DECOMPOSITIONS, DECOMPOSITIONS
    for table in (ops.default_decompositions(), DECOMPOSITIONS, AOT_DECOMPOSITIONS):
        assert table[aten.t.default] is ops._t and table[aten.transpose.int] is ops._transpose
