"""ember's copy of torch's core ATen decomposition table (``ember.aot.ops.core_aten_table``): built
with the dispatcher's CompositeImplicitAutograd ops materialized once instead of once per op
namespace (a cold process's trace waits for the table), and equal to torch's own."""
import functools

import torch
from torch._decomp import core_aten_decompositions

from ember.aot import ops


def _same(a, b) -> bool:
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return (getattr(a.func, "__qualname__", a.func) == getattr(b.func, "__qualname__", b.func)
                and a.args == b.args and a.keywords == b.keywords)
    if getattr(a, "__code__", None) is not None and getattr(b, "__code__", None) is not None:
        return a.__code__ is b.__code__ and a.__qualname__ == b.__qualname__  # (torch makes some per call)
    return a is b


def test_the_table_equals_torchs():
    ours = ops.core_aten_table.__wrapped__()
    theirs = {**core_aten_decompositions(), **ops.FAST_VIEW_DECOMPOSITIONS}
    assert ours.keys() == theirs.keys()
    assert [op for op in ours if not _same(ours[op], theirs[op])] == []


def test_the_dispatchers_ops_are_materialized_once(monkeypatch):
    from torch._export import utils as export_utils
    calls = []
    real = export_utils._materialize_cpp_cia_ops
    monkeypatch.setattr(export_utils, "_materialize_cpp_cia_ops", lambda: calls.append(1) or real())
    ops.core_aten_table.__wrapped__()
    assert calls == [1]
    assert export_utils._materialize_cpp_cia_ops is not real and export_utils._materialize_cpp_cia_ops.__name__ == "<lambda>"
    assert torch.ops.aten.linear.default in ops.core_aten_table()
