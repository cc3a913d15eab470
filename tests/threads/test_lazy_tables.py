"""Tables that compiled code fills lazily while it runs, from any thread: the resume functions and
callees of graph breaks (one FrameCache per target, compiled once and shared; results and printed
side effects match eager) and the native backend's generated modules (one module per path)."""
import contextlib
import io

import pytest
import torch

import ember
from ember.diagnostics.counters import snapshot
from ember.testing import cache_of
from tests.threads.helpers import fast_switching, run_threads  # noqa: F401 - a fixture

N_THREADS = 6


def inner(x):
    print("inner", end="")  # a break inside the callee: it is compiled on its own
    return x.cos()


def f(x):
    y = x.sin() * 2
    print("|", end="")  # a graph break: the rest runs in a resume function
    z = inner(y) + 1
    return z.relu()


def test_break_functions_compiled_once_across_threads(fast_switching):
    cf = ember.compile(f, backend="aot_eager")
    xs = [torch.randn(4) for _ in range(N_THREADS)]
    before = snapshot()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        results = run_threads(N_THREADS, lambda i: cf(xs[i]))
    for x, r in zip(xs, results):
        torch.testing.assert_close(r, _eager(x))
    assert out.getvalue().count("|") == N_THREADS and out.getvalue().count("inner") == N_THREADS
    caches = cache_of(cf).break_context.caches()
    assert caches, "expected a resume function compiled at the break"
    for c in caches:
        assert c.compile_count <= 1, f"{c.root.name} compiled {c.compile_count} times"
    assert len(caches) == len({c.root.name for c in caches})  # one cache per target
    assert snapshot() - before == {}


def _eager(x):
    with contextlib.redirect_stdout(io.StringIO()):
        return f(x)


def test_break_context_makes_one_cache_per_target_under_races():
    """Resume functions and callees are looked up while compiled code runs, from any thread; a slow
    factory widens the window in which two threads could both create (and compile) one."""
    import time

    from ember.frontend.breaks import BreakContext

    made = []

    def slow_cache(fn):
        time.sleep(0.02)  # (a FrameCache is cheap to build; the sleep only makes the race certain)
        made.append(fn)
        return ("cache of", fn)

    ctx = BreakContext(slow_cache)

    def callee(x):
        return x + 1

    got = run_threads(N_THREADS, lambda i: ctx.compiled_callee(callee))
    assert len(made) == 1 and all(g is got[0] for g in got)
    resume = ctx.resume_for(f)
    target = _resume_target(f)
    got = run_threads(N_THREADS, lambda i: resume(target))
    assert len(made) == 2 and all(g is got[0] for g in got)


def _resume_target(fn):
    """A bytecode index of ``fn`` where a resume function can start (after its first print call)."""
    from ember.frontend import resume as R

    for ins in R.bc.decode(fn.__code__):
        if ins.opname == "POP_TOP":
            return ins.index + 1
    raise AssertionError("no POP_TOP in f")


def test_a_generated_module_is_loaded_once_when_threads_load_it_together(tmp_path):
    """The native backend's generated wrappers and kernel modules: one module object per path (two
    would hold two copies of every @triton.jit function, each compiled and cached separately)."""
    from ember.native import cache

    text = "import time\ntime.sleep(0.02)  # a slow import widens the race\nTOKEN = object()\n"
    path = cache.write_source("kernels", text, base=str(tmp_path))  # named by its SHA-256, as kernels are
    mods = run_threads(N_THREADS, lambda i: cache.load_module(path))
    assert all(m is mods[0] for m in mods)
