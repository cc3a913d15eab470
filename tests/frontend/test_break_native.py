"""The bytecode of a straight-line graph break, run without compiling: the break function built for a
break at a call in the middle of an expression (its prologue rebuilds the stack with the call's NULL
where the running CPython keeps it, the call runs natively, its epilogue calls the resume function)
must behave as the original function. Pure Python, so it checks the code generation on whichever
CPython runs it (3.11, 3.12, and 3.13 through tests/frontend/test_py313.py): the NULL sits below the
callable up to 3.12 and above it on 3.13, and 3.13 passes keyword names to CALL_KW on the stack."""
import contextlib
import io
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # test_loop_drivers' run_driven

from ember.frontend import bytecode as bc, resume as R

NULL = object()  # a placeholder in the handed-over stack tuple: the prologue pushes a real NULL there


def brk(*args, **kwargs):
    print("brk", args, sorted(kwargs.items()))
    return sum(args) + sum(kwargs.values())


class Obj:
    def __init__(self, v):
        self.v = v

    def m(self, x, k=0):
        print("m", self.v, x, k)
        return self.v * x + k


def kw_call(a, b, c):
    y = a + brk(b, k=c)
    print("after", y)
    return y * 2


def method_call(a, obj, b):
    y = a - obj.m(b, k=3)
    z = [y, obj.m(1)]
    return z


def star_call(a, args):
    return a * brk(*args) + 1


def _callee_pair(fn_value):
    return [NULL, fn_value] if bc.PY < (3, 13) else [fn_value, NULL]


def run_break(fn, args, stack_at_call: list):
    """Break at ``fn``'s first call (what a graph break on an unsupported callee does), handing over
    ``stack_at_call`` (the values below the call's arguments, NULL where the call's NULL is)."""
    code = fn.__code__
    failing = next(i.index for i in bc.decode(code) if i.opname in ("CALL", "CALL_KW", "CALL_FUNCTION_EX"))
    start = R.region_start(code, failing)
    assert R.stack_depths(code)[start] == len(stack_at_call), (bc.decode(code)[start], stack_at_call)
    nulls = [v is NULL for v in stack_at_call]
    region = R.plan_region(code, start, failing, nulls)
    body = R.build_continuation(code, start, stack_nulls=nulls, bound=None, region=region,
                                resume_for=lambda t: R.resume_function(fn, t), name="__break_test")
    broken = R.make_function(fn, body)
    import inspect
    local_values = dict(inspect.signature(fn).bind(*args).arguments)
    return broken(tuple(None if v is NULL else v for v in stack_at_call), local_values)


def _both(fn, args, stack):
    out_eager, out_break = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out_eager):
        want = fn(*args)
    with contextlib.redirect_stdout(out_break):
        got = run_break(fn, args, stack)
    assert got == want and out_break.getvalue() == out_eager.getvalue(), (got, want, out_break.getvalue())


def test_keyword_call():
    # up to 3.12 the break starts at KW_NAMES (3.11: KW_NAMES, PRECALL); 3.13: the names are on the stack
    stack = [1, *_callee_pair(brk), 2, 3] + ([("k",)] if bc.PY >= (3, 13) else [])
    _both(kw_call, (1, 2, 3), stack)


def test_method_call():
    obj = Obj(5)
    _both(method_call, (10, obj, 2), [10, Obj.m, obj, 2, 3] + ([("k",)] if bc.PY >= (3, 13) else []))


def test_star_call():
    _both(star_call, (2, (1, 2)), [2, *_callee_pair(brk), (1, 2)])


def fib_swap(n):
    a = b = 1
    for i in range(n):
        a, b = b, a + b  # 3.13: LOAD_FAST_LOAD_FAST ... STORE_FAST_STORE_FAST
        print("ab", a, b)
    return a, b


def test_driver_gives_back_locals_of_a_pair_store():
    """A loop driver restores the locals its segments assign: on 3.13 a tuple swap stores both
    names with one STORE_FAST_STORE_FAST, which the driver must count as writing both."""
    from test_loop_drivers import run_driven
    out_eager, out_driven = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out_eager):
        want = fib_swap(5)
    with contextlib.redirect_stdout(out_driven):
        got = run_driven(fib_swap, (5,), {"a": 1, "b": 1})
    assert got == want and out_driven.getvalue() == out_eager.getvalue()
