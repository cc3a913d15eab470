"""A nested function (a def or lambda run inside its maker, a new object at every call) is guarded by
its code, globals and constant defaults, and by the closure values the trace reads, not by its
identity (ember/frontend/variables/functions.py: _guard_nested_by_code). With an identity guard, a
frame resumed after a graph break recompiled at every call until its recompile limit (PyTorch's
test_no_recompile_inner_function). Every case here checks the results against eager as well: the
guards must still tell apart what changes a result."""
import functools
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


def test_tensor_default_is_read_as_an_input():
    def fn(x, b):
        def inner(y, bias=b):
            return y + bias
        _break()
        return inner(x)
    x = torch.randn(4)
    assert _compiles(fn, [(x, torch.randn(4)) for _ in range(3)]) == 1


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


# ---- keyword-only defaults, typed constants -----------------------------------------------------

def test_keyword_only_default_that_changes_is_seen():
    def fn(x, n):
        def inner(y, *, p=n):
            return y * p
        _break()
        return inner(x)
    x = torch.randn(4)
    # the same default: one graph (after the break; before it there is no op); another: a new one
    assert _compiles(fn, [(x, 1.5)] * 3 + [(x, 2.5), (x, 1.5)]) == 2


@pytest.mark.parametrize("kw", [False, True], ids=["defaults", "kwdefaults"])
def test_default_of_another_type_but_equal_is_another_constant(kw):
    # 2 == 2.0 == True as Python values, so ``(2,) == (2.0,)`` held for the defaults guard: the int
    # tensor's graph (an int result) was taken for 2.0 (a float result) and for True
    def fn(x, n):
        if kw:
            def inner(y, *, p=n):
                return y * p
        else:
            def inner(y, p=n):
                return y * p
        _break()
        return inner(x)
    xi = torch.arange(4)
    assert _compiles(fn, [(xi, 2), (xi, 2.0), (xi, 2), (xi, True), (xi, 1), (xi, 2.0)]) == 4


def test_default_of_negative_zero():
    # -0.0 == 0.0, yet 1 / (y * 0 + p) tells them apart (and the native code must keep the sign)
    def fn(x, n):
        def inner(y, p=n):
            return 1 / (y * 0 + p)
        _break()
        return inner(x)
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    assert _compiles(fn, [(x, 0.0), (x, -0.0), (x, 0.0), (x, -0.0)]) == 2


def test_keyword_only_tensor_default_is_read_as_an_input():
    # a default not a constant is read where the call uses it (``fn.__kwdefaults__['bias']``) and
    # guarded there like any input: a new tensor at each call is the same graph (it recompiled at
    # every call while the function kept its identity guard), another shape another graph
    def fn(x, b):
        def inner(y, *, bias=b):
            return y + bias
        _break()
        return inner(x)
    x = torch.randn(4)
    assert _compiles(fn, [(x, torch.randn(4)) for _ in range(3)] + [(x, torch.randn(1))]) == 2


def test_list_defaults_are_guarded_where_read_and_written_back():
    def fn(x, acc, vals):
        def inner(y, log=acc, *, scale=vals):
            log.append(len(log))
            return y * scale[0] + len(log)
        _break()
        return inner(x)
    x = torch.randn(3)
    ours, eager = [], []
    ember.reset()
    opt = ember.compile(fn)
    before = counters.compiled_snapshot()
    for v in (1.0, 1.0, 2.0):
        torch.testing.assert_close(opt(x, ours, [v]), fn(x, eager, [v]))
    assert ours == eager == [0, 1, 2]
    # (len(log) is a constant of each graph: three lengths, three graphs)
    assert (counters.compiled_snapshot() - before)["graphs_compiled"] == 3
    for v in (1.0, 3.0):  # a fresh list again: the first graph; 3.0, a float read: a new constant
        torch.testing.assert_close(opt(x, [], [v]), fn(x, [], [v]))
    assert (counters.compiled_snapshot() - before)["graphs_compiled"] == 4


def test_reading_kwdefaults_and_closure_of_a_passed_function():
    def fn(x, f):
        return x * f.__kwdefaults__["p"] + f.__closure__[0].cell_contents

    def make(c):
        def g(y, *, p=c * 2):
            return y + c
        return g
    x = torch.randn(3)
    assert _compiles(fn, [(x, make(1.0)), (x, make(2.0)), (x, make(1.0))]) == 2


# ---- functions reached through containers, attributes, partials ---------------------------------

def _adder(c):
    return lambda y: y + c


def _scaler(c):
    def g(y):
        return y * c
    return g


def test_functions_in_a_list():
    def fn(x, fns):
        for f in fns:
            x = f(x)
        return x
    x = torch.randn(4)
    # new function objects of the same code and closure values: no recompile
    assert _compiles(fn, [(x, [_adder(1.0), _scaler(2.0)]), (x, [_adder(1.0), _scaler(2.0)]),
                          (x, [_adder(1.0), _scaler(3.0)]), (x, [_scaler(2.0), _adder(1.0)])]) == 3


def test_functions_in_a_dict_and_a_tuple():
    def fn(x, table, pair):
        return table["f"](x) + pair[0](x) * pair[1](x)
    x = torch.randn(4)
    calls = [(x, {"f": _scaler(2.0)}, (_adder(1.0), _adder(2.0))) for _ in range(3)]
    calls += [(x, {"f": _adder(2.0)}, (_adder(1.0), _adder(2.0))), (x, {"f": _scaler(2.0)}, (_adder(1.0), _adder(5.0)))]
    assert _compiles(fn, calls) == 3


def test_nested_function_passed_in_and_made_inside():
    def fn(x, f):
        def g(y):
            return f(y) + 1
        _break()
        return g(x) + f(x)
    x = torch.randn(4)
    # before the break: no op; after it: g and f, each guarded by its code and closure values
    assert _compiles(fn, [(x, _scaler(2.0)), (x, _scaler(2.0)), (x, _adder(2.0)), (x, _scaler(3.0))]) == 3


def test_closure_cell_rebound_between_calls():
    def make():
        k = 1.0

        def f(y):
            return y * k

        def set_k(v):
            nonlocal k
            k = v
        return f, set_k
    f, set_k = make()

    def fn(x, f):
        return f(x)
    ember.reset()
    opt = ember.compile(fn)
    before = counters.compiled_snapshot()
    x = torch.randn(4)
    for v in (1.0, 1.0, 2.0, 2.0, 1.0):
        set_k(v)
        torch.testing.assert_close(opt(x, f), fn(x, f))
    assert (counters.compiled_snapshot() - before)["graphs_compiled"] == 2


def test_function_stored_on_an_object():
    class Holder:
        pass

    def fn(x, h):
        return h.f(x)
    h = Holder()
    ember.reset()
    opt = ember.compile(fn)
    before = counters.compiled_snapshot()
    x = torch.randn(4)
    for c in (1.0, 1.0, 2.0, 1.0):
        h.f = _scaler(c)  # a new function each time, on the same object
        torch.testing.assert_close(opt(x, h), fn(x, h))
    other = Holder()
    other.f = _adder(1.0)
    torch.testing.assert_close(opt(x, other), fn(x, other))
    assert (counters.compiled_snapshot() - before)["graphs_compiled"] == 3


def test_partial_of_a_nested_function():
    def fn(x, p):
        return p(x)

    def make(c, k=2.0):
        def g(y, k):
            return y * k + c
        return functools.partial(g, k=k)
    x = torch.randn(4)
    assert _compiles(fn, [(x, make(1.0)), (x, make(1.0)), (x, make(2.0)), (x, make(1.0, k=3.0))]) == 3


def test_partial_of_a_nested_function_made_before_a_break():
    def fn(x, c):
        def g(y, k):
            return y * k + c
        p = functools.partial(g, k=2.0)
        _break()
        return p(x)
    x = torch.randn(4)
    assert _compiles(fn, [(x, 1.0), (x, 1.0), (x, 2.0)]) == 2


def test_function_name_read_by_the_trace():
    def fn(x, f):
        return x + 1 if f.__name__ == "a" else x - 1

    def make(name):
        g = _adder(0.0)
        g.__name__ = name  # (a slot of the function, not in its __dict__)
        return g
    x = torch.randn(3)
    assert _compiles(fn, [(x, make("a")), (x, make("b")), (x, make("a"))]) == 2


# ---- which object it is, after passing through a container -------------------------------------

def _two_of_one_code():
    make = lambda: (lambda y: y)  # noqa: E731
    return make(), make()


@pytest.mark.parametrize("test", ["is", "in_list", "in_set", "dict_key", "eq", "id", "hash"])
def test_identity_after_a_list(test):
    def fn(x, fns, g):
        if test == "is":
            same = fns[0] is g
        elif test == "in_list":
            same = g in fns
        elif test == "in_set":
            same = g in set(fns)
        elif test == "dict_key":
            same = {f: i for i, f in enumerate(fns)}.get(g, -1) == 0
        elif test == "eq":
            same = fns[0] == g
        elif test == "id":
            same = id(fns[0]) == id(g)
        else:
            same = hash(fns[0]) == hash(g)
        return x + 1 if same else x - 1
    a, b = _two_of_one_code()
    x = torch.randn(3)
    # each answer holds for those objects only: four pairs, four graphs, each right against eager
    assert _compiles(fn, [(x, [a], a), (x, [a], b), (x, [b], b), (x, [b], a), (x, [a], a)]) == 4
