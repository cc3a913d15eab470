"""Several threads reaching ember's first compiles at the same moment (a Barrier lines them up):
every result equals eager, nothing falls back to eager because of the concurrency, and a frame
compiled by one thread is reused by the threads that waited for it (not compiled again)."""
import warnings

import pytest
import torch

import ember
from ember.diagnostics.counters import COUNTERS, snapshot
from ember.testing import cache_of
from tests.threads.helpers import run_threads

N_THREADS = 6


def make_fn(k):
    def f(x, y):
        return (x * (k + 1)).sin() + y.relu() @ y.t() - x.sum(0, keepdim=True)
    return f


@pytest.mark.parametrize("backend", ["ember", "aot_eager"])
def test_distinct_functions_first_compile_together(backend):
    fns = [make_fn(k) for k in range(N_THREADS)]
    compiled = [ember.compile(f, backend=backend) for f in fns]
    xs = [(torch.randn(5, 5, requires_grad=(i % 2 == 0)), torch.randn(5, 5)) for i in range(N_THREADS)]
    before = snapshot()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a silent-looking eager fallback warns: make it fail the test
        outs = run_threads(N_THREADS, lambda i: compiled[i](*xs[i]))
    for i in range(N_THREADS):
        torch.testing.assert_close(outs[i], fns[i](*xs[i]))
        assert cache_of(compiled[i]).fallback_reason is None
    assert snapshot() - before == {}, "eager fallbacks while compiling from several threads"


@pytest.mark.parametrize("backend", ["ember", "aot_eager"])
def test_one_function_is_compiled_once_and_shared(backend):
    f = make_fn(3)
    cf = ember.compile(f, backend=backend)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    before = snapshot()
    outs = run_threads(N_THREADS, lambda i: cf(x, y))
    for out in outs:
        torch.testing.assert_close(out, f(x, y))
    cache = cache_of(cf)
    assert cache.compile_count == 1 and len(cache.entries) == 1  # the waiting threads used that entry
    assert snapshot() - before == {}


def test_backward_in_threads_matches_eager():
    f = make_fn(1)
    cf = ember.compile(f, backend="aot_eager")

    def work(i):
        n = 3 + i % 2  # two sizes: the second is a recompile (or a dynamic entry) racing the first
        x = torch.randn(n, n, requires_grad=True)
        y = torch.randn(n, 2, requires_grad=True)
        cf(x, y).sum().backward()
        gx, gy = x.grad.clone(), y.grad.clone()
        x.grad = y.grad = None
        f(x, y).sum().backward()
        return gx, gy, x.grad, y.grad

    for gx, gy, ex, ey in run_threads(N_THREADS, work):
        torch.testing.assert_close(gx, ex)
        torch.testing.assert_close(gy, ey)
