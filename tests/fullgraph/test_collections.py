"""``collections.defaultdict.fromkeys`` and ``collections.namedtuple(...)`` called inside the
compiled function (the class is made once while tracing: calls of the compiled function share it)."""
import collections

import pytest

from .harness import Cases, run, t

cases = Cases("collections")


def x1():
    return (t(3, grad=True),)


@cases.case(x1)
def defaultdict_fromkeys(x):
    d = collections.defaultdict.fromkeys(["a", "b"], 2)
    d["c"] = x
    return x * d["a"], d, d.default_factory


@cases.case(x1)
def defaultdict_fromkeys_no_value(x):
    d = collections.defaultdict.fromkeys("xy")
    return x + len(d), d, d["x"]


@cases.case(x1)
def ordered_dict_fromkeys(x):
    d = collections.OrderedDict.fromkeys(["b", "a"], 0)
    d.move_to_end("b")
    return x + 1, list(d), d


@cases.case(x1)
def namedtuple_created_inside(x):
    Point = collections.namedtuple("Point", ["a", "b"])
    p = Point(x * 2, b=3)
    q = p._replace(b=4)
    return p.a * p.b + q.b, p.b, tuple(q)[1], Point._fields


@cases.case(x1)
def namedtuple_defaults(x):
    Pair = collections.namedtuple("Pair", "left right", defaults=[10])
    p = Pair(x)
    return p.left + p.right, p.right


@pytest.mark.parametrize("c", cases, ids=cases.ids())
def test_case(c):
    run(c)
