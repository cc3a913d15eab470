"""ember's copy of torch's core ATen decomposition table (``ember.aot.ops.core_aten_table``) equals
torch's own, plus ember's faster view decompositions."""
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
    ours = ops._build_core_aten()  # (the whole table, built as ember builds it when iterated)
    theirs = {**core_aten_decompositions(), **ops.FAST_VIEW_DECOMPOSITIONS}
    assert ours.keys() == theirs.keys()
    assert [op for op in ours if not _same(ours[op], theirs[op])] == []
