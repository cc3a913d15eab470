"""A nested function (a def or lambda run inside its maker, a new object at every call) is guarded by
its code, globals and constant defaults, and by the closure values the trace reads, not by its
identity (ember/frontend/variables/functions.py: _guard_nested_by_code). With an identity guard, a
frame resumed after a graph break recompiled at every call until its recompile limit (PyTorch's
test_no_recompile_inner_function). Every case here checks the results against eager as well: the
guards must still tell apart what changes a result."""
import types

import pytest
import torch

import ember
from ember.diagnostics import counters


def _compiles(fn, calls):
    """Run ``fn`` compiled on each (args) of ``calls``, check each result against eager's; return the
    graphs compiled."""
    ember.reset()
    opt = ember.compile(fn)
    before = counters.compiled_snapshot()
    for args in calls:
        torch.testing.assert_close(opt(*args), fn(*args))
    return (counters.compiled_snapshot() - before)["graphs_compiled"]


def _break():
    print("", end="")  # a graph break (print has a side effect a graph cannot hold)


def test_inner_function_across_a_break_compiles_once():
    def fn(x):
        def inner(y):
            return torch.sin(y) * 2
        x = inner(x)
        _break()
        return inner(x) + 1
    x = torch.randn(4)
    assert _compiles(fn, [(x,)] * 6) == 2  # before and after the break, once each


def test_inner_lambda_across_a_break_compiles_once():
    def fn(x):
        f = lambda y: y.cos() + 1  # noqa: E731
        x = f(x)
        _break()
        return f(x)
    assert _compiles(fn, [(torch.randn(3),)] * 5) == 2


def test_closure_value_that_changes_is_seen():
    def fn(x, k):
        def inner(y):
            return y * k  # k: a closure cell of inner
        _break()
        return inner(x)
    x = torch.randn(4)
    _compiles(fn, [(x, 1.0), (x, 2.0), (x, 3.0), (x, 2.0)])


def test_closure_tensor_that_changes_is_read_at_each_call():
    def fn(x, w):
        def inner(y):
            return y @ w
        _break()
        return inner(x)
    x = torch.randn(2, 3)
    _compiles(fn, [(x, torch.randn(3, 3)) for _ in range(4)])


def test_constant_default_that_changes_is_seen():
    def fn(x, n):
        def inner(y, p=n):
            return y ** p
        _break()
        return inner(x)
    x = torch.rand(4) + 0.5
    _compiles(fn, [(x, 1), (x, 2), (x, 3), (x, 2)])


def test_tensor_default_keeps_the_identity_guard():
    def fn(x, b):
        def inner(y, bias=b):
            return y + bias
        _break()
        return inner(x)
    x = torch.randn(4)
    _compiles(fn, [(x, torch.randn(4)) for _ in range(3)])


def test_lambdas_passed_in_with_other_closures():
    def fn(x, f):
        return f(x) * 2
    x = torch.randn(4)

    def make(c):
        return lambda y: y + c
    assert _compiles(fn, [(x, make(1.0)), (x, make(1.0)), (x, make(5.0))]) == 2  # (5.0: a new constant)


def test_same_code_other_globals_traces_again():
    def fn(x, f):
        return f(x)

    def make():
        def g(y):
            return y * SCALE  # noqa: F821 - a global of whichever dict the function was made with
        return g
    proto = make()
    f1 = types.FunctionType(proto.__code__, {"SCALE": 2.0}, "g", None, proto.__closure__)
    f2 = types.FunctionType(proto.__code__, {"SCALE": 7.0}, "g", None, proto.__closure__)
    x = torch.randn(3)
    _compiles(fn, [(x, f1), (x, f2), (x, f1)])


def test_function_with_attributes_keeps_the_identity_guard():
    def fn(x, f):
        return f(x)

    def make(c):
        def g(y):
            return y + g.offset + c
        g.offset = c * 10
        return g
    x = torch.randn(3)
    _compiles(fn, [(x, make(1.0)), (x, make(2.0))])


@pytest.mark.parametrize("nonlocal_write", [False, True])
def test_closure_written_by_the_inner_function(nonlocal_write):
    def fn(x):
        total = torch.zeros(())

        def add(y):
            nonlocal total
            total = total + y.sum()
            return total
        add(x)
        _break()
        add(x * 2)
        return total + (1 if nonlocal_write else 0)
    _compiles(fn, [(torch.randn(4),) for _ in range(3)])


def test_identity_of_a_nested_function_still_counts():
    """``f is g`` and dict lookups by function compare objects: the trace that reads them guards the
    function's identity again (two functions of the same code must not take the baked answer)."""
    def same(x, f, g):
        return x + 1 if f is g else x - 1

    def keyed(x, f, g):
        table = {f: 2.0}
        return x * table.get(g, 3.0)

    def make():
        return lambda y: y
    x = torch.randn(3)
    a, b = make(), make()
    for fn in (same, keyed):
        _compiles(fn, [(x, a, a), (x, a, b), (x, b, b), (x, b, a)])
