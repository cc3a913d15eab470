"""A storage offset the code reads is guarded (a view at another offset recompiles); one it never
reads is not (views at any offset share the compile, as in torch.compile)."""
import torch

import ember
from ember.testing import CompileCounter, cache_of


def _run(fn, views):
    cnt = CompileCounter()
    compiled = ember.compile(fn, backend=cnt)
    for v in views:
        torch.testing.assert_close(compiled(v), fn(v))
    return cache_of(compiled)


def _views():
    base = torch.arange(12.0)
    return [base[1:4], base[2:5], base[5:8], base[2:5]]


def test_offset_read_by_method_is_guarded():
    cache = _run(lambda x: x + x.storage_offset(), _views())
    assert cache.compile_count == 3, cache.recompile_reasons
    assert any("storage_offset() changed" in r for r in cache.recompile_reasons), cache.recompile_reasons


def test_offset_read_unbound_and_of_a_view_is_guarded():
    # the offset of an intermediate view derives from its input's: the input's is pinned
    cache = _run(lambda x: x * torch.Tensor.storage_offset(x[1:]), _views())
    assert cache.compile_count == 3, cache.recompile_reasons


def test_offset_not_read_is_not_guarded():
    cache = _run(lambda x: x * 2 + x.stride(0), _views())
    assert cache.compile_count == 1, cache.recompile_reasons
