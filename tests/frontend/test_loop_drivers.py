"""The bytecode of loop drivers, run without any compiling: a driver built for a break inside a loop
(ember/frontend/loops.py), with each body segment being the *native* scoped copy (what a segment runs
when it falls back to eager), must behave exactly as the original function: the driver's dispatch,
the copies' hand-backs at the loop's stops, tagged returns, exception tables. Pure Python, so it
checks the code generation on whichever CPython runs the suite (3.11 and 3.12 lay loops out
differently)."""
import contextlib
import inspect
import io

import pytest

from ember.frontend import bytecode as bc, loops as L, resume as R


def _continuation(fn, scope):
    def get(target):
        if scope is not None and scope.stops_trace(target):
            return L.stopped(target)
        return R.resume_function(fn, target, scope)
    return get


def _exit(get):
    def leave(r):
        target, stack, locals_ = r
        return stack[0] if target == L.RETURN else get(target)(stack, locals_)
    return leave


def run_driven(fn, args, before: dict):
    """Run ``fn`` from its loop on: the driver of a break at the loop's first ``print``."""
    code = fn.__code__
    j = next(i.index for i in bc.decode(code) if i.opname == "LOAD_GLOBAL" and i.argval == "print")
    start = R.region_start(code, j)
    depth = R.stack_depths(code)[start]
    region = R.plan_region(code, start, j, [False] * depth)
    assert region.drive is not None
    top = _continuation(fn, None)
    driver = R.make_function(fn, R.build_continuation(
        code, start, stack_nulls=[False] * depth, bound=None, region=region, resume_for=top, name="driver",
        segment_for=lambda e: R.resume_function(fn, e, region.drive), exit_fn=_exit(top)))
    local_values = dict(inspect.signature(fn).bind(*args).arguments, **before)
    return driver((), local_values)


def for_loop(n):
    acc = []
    for i in range(n):
        acc.append(i)
        print("i", i)
        if i == 1:
            continue
        if i == 4:
            break
        acc.append(-i)
    else:
        acc.append("else")
    return acc


def nested_with_return(n):
    acc = 0
    for a in range(n):
        for b in range(a):
            print(a, b)
            acc += a * b
            if a * b == 6:
                return acc, "early"
        acc -= 1
    return acc


def while_continue(n):
    i = 0
    out = []
    while i < n:
        i += 1
        if i == 2:
            continue
        print("w", i)
        out.append(i)
    return out


def try_finally_around(xs):
    acc = 0
    try:
        for v in xs:
            print("v", v)
            acc += 10 // v
    finally:
        acc += 1000
    return acc


def _squares(n):
    for i in range(n):
        yield i * i


def generator_and_comprehension(n):
    out = []
    for sq in _squares(n):
        print("sq", sq)
        out.append([sq + k for k in range(2)])
    return out


def try_inside_body(n):
    out = []
    for i in range(n):
        try:
            print("t", i)
            if i == 1:
                raise KeyError(i)
        except KeyError:
            out.append("caught")
        out.append(i)
    return out


def except_around(xs):
    total = 0
    try:
        for x in xs:
            total += x
            print("x", x)
            if x < 0:
                raise ValueError(x)
    except ValueError:
        total = -total
    return total


CASES = [(for_loop, (6,), {"acc": []}), (for_loop, (3,), {"acc": []}), (nested_with_return, (5,), {"acc": 0}),
         (nested_with_return, (3,), {"acc": 0}), (while_continue, (5,), {"i": 0, "out": []}),
         (try_finally_around, ([1, 2, 5],), {"acc": 0}), (try_finally_around, ([1, 0, 5],), {"acc": 0}),
         (generator_and_comprehension, (3,), {"out": []}), (try_inside_body, (3,), {"out": []}),
         (except_around, ([1, 2, -3, 4],), {"total": 0}), (except_around, ([1, 2],), {"total": 0})]


@pytest.mark.parametrize("fn, args, before", CASES, ids=[f"{c[0].__name__}{c[1]}" for c in CASES])
def test_native_driver_matches_the_function(fn, args, before):
    def outcome(call):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                result = ("returned", call())
            except Exception as exc:  # the driver must raise what the function raises
                result = ("raised", repr(exc))
        return result, out.getvalue()
    want = outcome(lambda: fn(*args))
    got = outcome(lambda: run_driven(fn, args, {k: (list(v) if isinstance(v, list) else v) for k, v in before.items()}))
    assert got == want


def test_loop_analysis():
    loops = L.find_loops(nested_with_return.__code__)
    assert [lp.kind for lp in loops] == ["for", "for"]
    outer, inner = loops
    assert outer.first < inner.first <= inner.last <= outer.last
    (w,) = L.find_loops(while_continue.__code__)
    assert w.kind == "while"
    # 3.12 places handlers after the function body and jumps back from there: no loop of its own
    assert [lp.kind for lp in L.find_loops(try_inside_body.__code__)] == ["for"]


def _comprehensions_and_a_loop(x, it):
    rest = [(k, c) for k, (_, c) in it]
    for a in x:
        rest.append(a)
    return rest, {a for a in x}


def test_inlined_comprehensions_are_not_driven():
    """3.12 inlines comprehensions into the function's frame (PEP 709); a driver around one crashed
    CPython 3.12, so such loops run as Python. Before 3.12 a comprehension is a code object of its own."""
    from ember.frontend import bytecode as bc
    from ember.frontend import loops as L

    code = _comprehensions_and_a_loop.__code__
    found = [L.inlined_comprehension(code, lp) for lp in L.find_loops(code)]
    assert found == ([True, False, True] if bc.PY >= (3, 12) else [False])
