"""Every fallback to eager is counted in ember.diagnostics.counters (what lets a test assert "0
fallbacks"): a frame that cannot be compiled, the recompile limit, an autograd variant that cannot be
traced, a per-size native compile that fails."""
import warnings

import pytest
import torch

import ember
from ember.config import config
from ember.diagnostics import counters
from ember.frontend.errors import Unsupported


def delta(before):
    return dict(counters.snapshot() - before)


def test_recompile_limit_fallbacks_are_counted(monkeypatch):
    monkeypatch.setattr(config, "recompile_limit", 1)
    cf = ember.compile(lambda x: x * 2, backend="eager", dynamic=False)
    before = counters.snapshot()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (2, 3, 4):
            torch.testing.assert_close(cf(torch.ones(n)), torch.ones(n) * 2)
    assert delta(before) == {"eager_fallbacks": 2, "eager_fallbacks.recompile_limit": 2}


def test_a_frame_that_cannot_be_compiled_counts_each_eager_call(monkeypatch):
    from ember.frontend import cache as cache_mod

    def refuse(*a, **k):
        raise Unsupported("a construct this test pretends ember cannot trace")

    monkeypatch.setattr(cache_mod, "compile_entry", refuse)
    cf = ember.compile(lambda x: x + 1, backend="eager")
    before = counters.snapshot()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            cf(torch.ones(2))
    assert delta(before) == {"eager_fallbacks": 3, "eager_fallbacks.frame": 3}


def test_an_autograd_variant_that_cannot_be_traced_is_counted(monkeypatch):
    from ember.aot import pipeline

    def fail(*a, **k):
        raise RuntimeError("tracing failed (simulated)")

    monkeypatch.setattr(pipeline, "build_variant", fail)
    cf = ember.compile(lambda x: x.sin(), backend="aot_eager")
    before = counters.snapshot()
    with pytest.warns(UserWarning, match="running .* eagerly"):
        torch.testing.assert_close(cf(torch.ones(3)), torch.ones(3).sin())
    assert delta(before) == {"eager_fallbacks": 1, "eager_fallbacks.aot_variant": 1}


def test_a_failed_per_size_native_compile_is_counted():
    from ember.native.specialize import PerShapeGraph

    gm = torch.fx.symbolic_trace(lambda x: x * 3)

    def broken_compiler(g, args):
        raise RuntimeError("codegen failed (simulated)")

    graph = PerShapeGraph(gm, broken_compiler, "test")
    before = counters.snapshot()
    with pytest.warns(UserWarning, match="running a graph eagerly"):
        torch.testing.assert_close(graph(torch.ones(4)), torch.ones(4) * 3)
    graph(torch.ones(4))  # the same sizes again: the eager graph is kept, not counted twice
    assert delta(before) == {"eager_fallbacks": 1, "eager_fallbacks.native_per_shape": 1}
