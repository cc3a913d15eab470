"""Opcode handlers checked by their results: each function uses one construct on values decided
while tracing (so the handler's answer is baked into the graph), is compiled with fullgraph=True,
and must return what eager returns for every input. These kill the handler mutants of
tools/mutation.py; each construct appears with both outcomes (true/false, hit/miss)."""
import sys

import pytest
import torch

import ember
from ember.testing import CompileCounter


def _check(fn, *calls):
    counter = CompileCounter()
    compiled = ember.compile(fn, backend=counter, fullgraph=True)
    for args in calls:
        expected, actual = fn(*args), compiled(*args)
        assert type(actual) is type(expected)
        flat_e = expected if isinstance(expected, tuple) else (expected,)
        flat_a = actual if isinstance(actual, tuple) else (actual,)
        for a, e in zip(flat_a, flat_e, strict=True):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(a, e)
            else:
                assert a == e, (a, e)


X = torch.randn(3)


def is_not(x, flag):
    # `is None` in a condition becomes POP_JUMP_IF_NONE; as values and against other objects, IS_OP
    return x + 1 if flag is not True else x - 1, flag is not None, flag is not True


def is_(x, flag):
    return x + 1 if flag is True else x - 1, flag is None, flag is True


def not_in(x, key):
    return x * 2 if key not in ("a", "b") else x * 3


def in_(x, key):
    return x * 2 if key in {"a": 1, "b": 2} else x * 3


@pytest.mark.parametrize("fn", [is_not, is_, not_in, in_])
def test_identity_and_membership(fn):
    args = [(X, None), (X, True), (X, 1)] if fn in (is_not, is_) else [(X, "a"), (X, "z")]
    _check(fn, *args)


def const_key_dict(x, y):
    d = {"first": x, "second": y * 2}
    return d["first"] - d["second"], tuple(d)


def test_dict_literal_pairs_keys_with_values():
    _check(const_key_dict, (X, torch.randn(3)))


def star_unpack(x, y, z):
    a, b, *rest = (x, y * 2, z * 3, x)
    *init, c, d = (x, y, z * 5)
    return a - b, rest[0] + rest[1], init[0], c - d


def test_star_unpack_keeps_order():
    _check(star_unpack, (X, torch.randn(3), torch.randn(3)))


def fstrings(x, name):
    return x + len(f"{name!r}") + len(f"{name!s}-{name:>6}"), f"{name!r}|{name!a}|{name}"


def test_fstring_conversions():
    _check(fstrings, (X, "w\u00e9"), (X, "abc"))


def or_and(x, a, b):
    v = a or b
    w = a and b
    return x * v + w, v, w


def test_short_circuit_operators_pick_the_right_operand():
    _check(or_and, (X, 0, 3), (X, 2, 5), (X, 0, 0), (X, 4, 0))


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="JUMP_IF_*_OR_POP are 3.11 bytecode")
def test_or_pop_opcodes_are_used():
    import dis
    ops = {i.opname for i in dis.get_instructions(or_and)}
    assert {"JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"} <= ops, ops
