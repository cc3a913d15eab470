"""Python's data model under tracing: identity of objects made in the trace, ``is``/``==``/hash of
user objects, dict views, lazy iterators (one item pulled at a time), container types and their
subclasses surviving reconstruction. Every case is compared against eager Python."""
import collections
import itertools
from typing import NamedTuple

import torch

from .harness import case


def one():
    return (torch.randn(3),)


class Plain:
    pass


class ByValue:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, ByValue) and self.v == other.v

    __hash__ = None


class Pair(NamedTuple):
    a: torch.Tensor
    b: int


# ---- identity of objects made in the trace -----------------------------------------------------
@case(one)
def fresh_objects_are_distinct(x):
    a, b = Plain(), Plain()
    c = a
    return x + 1, a is b, a == b, a != b, a is c, a == c, [a] == [b], [a] == [c]


@case(one)
def fresh_objects_as_keys_and_members(x):
    a, b = Plain(), Plain()
    d = {a: x, b: x * 2}
    s = {a, b, a}
    return d[a], d[b], len(d), len(s), a in s, Plain() in s


@case(one)
def user_eq_decides_equality_not_identity(x):
    p, q = ByValue(1), ByValue(1)
    return x + 1, p == q, p != q, p is q, p == ByValue(2), [p] == [q]


@case(one)
def fresh_tuples_and_namedtuples(x):
    t, u = (x, 1), (x, 1)
    n, m = Pair(x, 1), Pair(x, 1)
    d = {n: 1, m: 2}
    return x + 1, t is u, t == u, tuple(t) is t, n is m, n == m, len(d), d[n]


@case(one)
def fresh_functions_are_distinct(x):
    f, g = (lambda v: v), (lambda v: v)
    return f(x) + 1, f is g, f == g, f is f


# ---- graph input names that are Python's or the GraphModule's own ------------------------------
def two():
    return (torch.randn(3), torch.randn(3))


@case(two)
def first_parameter_named_self(self, x):
    return self * 2 + x


@case(two)
def parameters_named_like_builtins(input, getattr):
    return input.sin() + getattr.shape[0] + input.size(0)


@case(two)
def parameter_named_like_fx_globals(inf, device):
    return inf * 2 + device


def big():
    return (torch.randn(4).abs() * 10 + 5,)


@case(big, breaks="data")
def norm_after_data_dependent_while(x):
    # the loop breaks the graph on its condition; Tensor.norm (whose first parameter is ``self``)
    # is then compiled as a frame of its own
    while x.sum() > 1:
        x = x / (x.norm() + 0.5)
    return x
