"""Constructing a user's ``dict`` subclass inside the compiled function, using it, returning it."""
import pytest

from .harness import Cases, run, t

cases = Cases("dict_subclass")


class Bag(dict):
    pass


class Config(dict):
    scale = 3

    def __init__(self, base, **kw):
        super().__init__(kw)
        self["base"] = base

    def scaled(self, key):
        return self[key] * self.scale

    def update(self, other):  # a Python override: dict.__init__ must not call it
        raise AssertionError("not reached")


class Counted(Bag):
    def total(self):
        return sum(self.values())


class Defaulting(dict):
    def __missing__(self, key):  # d[key] for a missing key (get() and `in` do not call it)
        return len(key) * 10


class Registry(dict):
    def __missing__(self, key):
        self[key] = value = [key]
        return value


def x1():
    return (t(3, grad=True),)


@cases.case(x1)
def plain_subclass(x):
    d = Bag(a=x, b=2)
    d["c"] = x + 1
    d.setdefault("e", 5)
    return d["a"] * d["b"] + d["c"], d, isinstance(d, Bag), type(d).__name__, sorted(d)


@cases.case(x1)
def subclass_with_init_and_methods(x):
    c = Config(x, w=2)
    return c.scaled("base") + c["w"], c, c.scale, len(c)


@cases.case(x1)
def subclass_inherited_method(x):
    c = Counted(a=x, b=x * 2)
    c2 = c.copy()  # dict.copy of a subclass: a plain dict
    merged = c | {"z": 1}  # dict.__or__: a plain dict too
    return c.total(), type(c2).__name__, type(merged).__name__, c2


@cases.case(x1)
def subclass_from_pairs(x):
    d = Bag([("k", x), ("j", 3)])
    return {k: v * 2 for k, v in d.items()}, d.get("j"), "k" in d


@cases.case(x1, name="copy_and_deepcopy")
def _copy_and_deepcopy(x):
    import copy

    d = Bag(a=x * 2)
    d.tag = [1]
    shallow = copy.copy(d)
    plain = Bag(n=3)
    plain.tag = [1]
    deep = copy.deepcopy(plain)
    d.tag.append(2)
    plain.tag.append(2)
    return shallow, shallow.tag, deep, deep.tag, type(deep).__name__, x * deep["n"]


@cases.case(x1)
def subclass_with_missing(x):
    d = Defaulting(a=x)
    r = Registry()
    r["p"].append(2)  # __missing__ inserts: the list is the dict's own
    return d["a"] + d["abc"], d.get("zz", -1), "abc" in d, len(d), r, r["p"]


@cases.case(x1)
def instance_attributes(x):
    d = Bag(a=x)
    d.tag = 2
    d.scale = x.sum()
    return d["a"] * d.tag + d.scale, d, d.tag


@pytest.mark.parametrize("c", cases, ids=cases.ids())
def test_case(c):
    run(c)


def test_subclass_changing_lookup_otherwise_still_breaks():
    # a __getitem__ of its own, or a __missing__ that is not a plain function: not modelled, so a
    # graph break (never a silent wrong lookup). (A plain __missing__ is traced: subclass_with_missing.)
    import torch

    import ember

    class Dflt(dict):
        __missing__ = staticmethod(lambda key: 0)

    class Upper(dict):
        def __getitem__(self, key):
            return dict.__getitem__(self, key.upper())

    def f(x):
        return x + Dflt()["nope"]

    def g(x):
        return x + Upper(A=1)["a"]

    for fn, name in ((f, "Dflt"), (g, "Upper")):
        with pytest.raises(ember.CompileError, match=name):
            ember.compile(fn, fullgraph=True)(torch.ones(2))
        assert torch.equal(ember.compile(fn)(torch.ones(2)), fn(torch.ones(2)))
