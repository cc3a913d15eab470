"""Functions whose bytecode the 3.13 runner decodes (tests/frontend/py313_runner.py): the constructs
ember's frontend traces (locals, calls with keywords and *args, methods, super(), closures, defaults,
f-strings, comprehensions, loops with break/continue/else, try/except/finally, with, generators,
imports, slicing, unpacking). Never called; only compiled."""
import math


def locals_and_swaps(a, b):
    x, y = a, b
    y, x = x, y
    c = d = a
    return x + y * c - d


def calls(a, *args, k=1, **kw):
    print(a, sep="", end="\n")
    r = max(a, *args, key=abs)
    s = dict(**kw, extra=k)
    t = math.sqrt(abs(a))
    return a.conjugate(), r, s, t, len(args)


class Base:
    def f(self, x):
        return x


class Child(Base):
    def f(self, x):
        return super().f(x) + super(Child, self).f(x)


def closures(n, scale=2.0, *, bias=0.0):
    def inner(z, w=3, *, q=scale):
        return z * scale + w + q + bias + n

    lam = lambda v: v + n  # noqa: E731
    return inner(1), lam(2)


def fstrings(x, y):
    return f"{x!r:>8} {y} {x!s} {y!a} {x:.3f}"


def branches(x, y):
    if x and not y:
        return 1
    if x is None or y is not None:
        return 2
    if x < y <= 3:
        return 3
    z = x if y else -x
    return z if x in (1, 2) else ~z


def loops(n):
    acc = []
    for i in range(n):
        if i == 1:
            continue
        if i == 5:
            break
        acc.append(i)
    else:
        acc.append(-1)
    while n > 0:
        n -= 1
    return acc, [i * i for i in range(3) if i], {i: i for i in acc}, {i for i in acc}, list(i for i in acc)


def exceptions(x):
    try:
        y = 1 / x
    except ZeroDivisionError as e:
        y = str(e)
    except (TypeError, ValueError):
        raise
    finally:
        x = None
    with open(__file__) as fh:
        fh.read()
    assert y is not None, "y"
    return y


def generator(n):
    yield n
    yield from range(n)
    return n


def imports_and_slices(seq, i):
    import os.path
    from math import pi
    a, *rest = seq
    seq[1:i] = rest
    del seq[0]
    return os.path.join("a", "b"), pi, seq[i:], seq[::2], (*seq, *rest), {**{}, "k": 1}


def globals_and_attrs(obj):
    global _COUNTER
    _COUNTER = getattr(obj, "x", 0)
    obj.y = _COUNTER
    del obj.y
    return obj.__class__.__name__


_COUNTER = 0
