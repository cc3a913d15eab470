"""Exceptions raised and caught inside traced code (a missing dict key behind Mapping.get, hasattr
through a class's own __getattribute__, raise/except, finally) trace without a graph break; one that
escapes the traced code is raised for real, after exactly the effects eager has."""
from collections.abc import MutableMapping

import pytest
import torch

import ember


class Registry(MutableMapping):
    """Like transformers' AttentionInterface: a class-wide mapping plus a local one."""

    _global = {"sdpa": 2}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._global[key]  # KeyError for an unknown key: Mapping.get catches it

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global) + len(self._local)


REGISTRY = Registry()


def _no_breaks(fn, *args):
    report = ember.explain(fn)(*args)
    assert report.graph_break_count == 0 and not report.fallbacks, report.break_reasons or report.fallbacks
    return report.out


def test_mapping_get_catches_the_key_error_of_getitem():
    def f(x):
        return x * REGISTRY.get("eager", 3) + REGISTRY.get("sdpa", 5) + ("eager" in REGISTRY)

    x = torch.randn(3)
    torch.testing.assert_close(_no_breaks(f, x), f(x))


def test_except_clauses_match_by_class():
    def f(x):
        try:
            {"q": 1}["w"]
        except (TypeError, LookupError) as e:
            x = x + len(e.args) + (str(e) == "'w'")
        try:
            raise ValueError("bad")
        except KeyError:
            x = x * 100
        except ValueError:
            x = x + 10
        try:
            x.no_such_attribute
        except AttributeError:
            x = x + 100
        return x

    x = torch.randn(2)
    torch.testing.assert_close(_no_breaks(f, x), f(x))


def test_hasattr_through_a_python_getattribute():
    class Aliased:
        def __getattribute__(self, key):
            return super().__getattribute__({"n": "count"}.get(key, key))

    def f(x):
        a = Aliased()
        a.count = 2
        return x * a.n + hasattr(a, "missing") + hasattr(a, "count")

    x = torch.randn(2)
    torch.testing.assert_close(_no_breaks(f, x), f(x))


def test_uncaught_exception_is_raised_after_the_finally_block():
    def f(x):
        try:
            return {"a": x}["b"]
        finally:
            x.add_(1)

    x = torch.zeros(2)
    with pytest.raises(KeyError, match="'b'"):
        ember.compile(f)(x)
    assert torch.equal(x, torch.ones(2))  # the finally block ran exactly once


def test_graph_break_inside_an_except_clause():
    def f(x):
        try:
            y = {"a": x}["b"]
        except KeyError:
            print("in the handler")  # a break here: the raise and its handler run as Python
            y = x + 1
        return y * 2

    x = torch.randn(2)
    torch.testing.assert_close(ember.compile(f)(x), f(x))


def test_hasattr_and_getattr_default_see_a_property_raising_attribute_error():
    class Lazy:
        @property
        def value(self):
            raise AttributeError("not computed yet")

    def f(x):
        lazy = Lazy()
        return x + hasattr(lazy, "value") + getattr(lazy, "value", 5)

    x = torch.randn(2)
    torch.testing.assert_close(_no_breaks(f, x), f(x))


def test_exception_leaving_a_no_grad_decorated_function_restores_grad_mode():
    @torch.no_grad()
    def lookup(table, x):
        return table["missing"] * x

    def f(x):
        try:
            y = lookup({}, x)
        except KeyError:
            y = x * 3  # grad mode is back on here, as in eager
        return y, torch.is_grad_enabled()

    x = torch.randn(2, requires_grad=True)
    (y, grad_on), (want, want_on) = _no_breaks(f, x), f(x)
    torch.testing.assert_close(y, want)
    assert grad_on is want_on is True and y.requires_grad


def test_context_manager_exit_sees_and_may_swallow_the_exception():
    class Suppress:
        def __init__(self):
            self.seen = None

        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb):
            self.seen = exc_type
            return exc_type is not None and issubclass(exc_type, KeyError)

    def f(x):
        y = x
        with Suppress() as s:
            y = {"a": x}["b"]
        return y + 1, s.seen is KeyError

    x = torch.randn(2)
    got, want = _no_breaks(f, x), f(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] is want[1] is True
