"""Operators: binary, in-place, comparison, identity, membership, unary; subscripts."""
from __future__ import annotations

import operator

from ember.frontend import builtins as B
from ember.frontend.bytecode import NB_OPS
from ember.frontend.errors import Unsupported
from ember.frontend.handlers import register
from ember.frontend.variables.base import ConstantVariable
from ember.frontend.variables.sequences import SliceVariable, TupleVariable


@register("BINARY_OP")
def BINARY_OP(tx, inst):
    b = tx.pop()
    a = tx.pop()
    symbol, inplace = NB_OPS[inst.arg]
    fn = (B.INPLACE if inplace else B.BINARY)[symbol]
    tx.push(B.apply_operator(tx, fn, a, b))


@register("COMPARE_OP", versions=((3, 11), (3, 12)))
def COMPARE_OP(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(B.apply_operator(tx, B.COMPARE[inst.argval], a, b))


@register("IS_OP")
def IS_OP(tx, inst):
    b = tx.pop()
    a = tx.pop()
    r = B.is_op(tx, a, b)
    tx.push(ConstantVariable(r != bool(inst.arg)))


@register("CONTAINS_OP")
def CONTAINS_OP(tx, inst):
    container = tx.pop()
    item = tx.pop()
    r = B.contains(tx, container, item)
    if inst.arg:
        r = ConstantVariable(not r.truth(tx))
    tx.push(r)


def _unary(fn):
    def handler(tx, inst):
        tx.push(B.call_builtin(tx, fn, [tx.pop()], {}))

    return handler


register("UNARY_NEGATIVE")(_unary(operator.neg))
register("UNARY_INVERT")(_unary(operator.invert))
register("UNARY_NOT")(_unary(operator.not_))
register("UNARY_POSITIVE", versions=((3, 11), (3, 11)))(_unary(operator.pos))

_INTRINSIC_STOPITERATION_ERROR = 3
_INTRINSIC_UNARY_POSITIVE = 5
_INTRINSIC_LIST_TO_TUPLE = 6


@register("CALL_INTRINSIC_1", versions=((3, 12), (3, 13)))
def CALL_INTRINSIC_1(tx, inst):
    if inst.arg == _INTRINSIC_UNARY_POSITIVE:
        tx.push(B.call_builtin(tx, operator.pos, [tx.pop()], {}))
    elif inst.arg == _INTRINSIC_LIST_TO_TUPLE:
        tx.push(TupleVariable(tx.pop().unpack(tx)))
    elif inst.arg == _INTRINSIC_STOPITERATION_ERROR:
        # 3.12+ generators end in a handler "CALL_INTRINSIC_1 3; RERAISE": CPython turns a StopIteration
        # into RuntimeError there (PEP 479). The exception stays as it is here: it leaves the frame on
        # the RERAISE, and the generator tracker's next() makes the RuntimeError (as for 3.11 frames).
        pass
    else:
        raise Unsupported(f"CALL_INTRINSIC_1 {inst.argval}")


# ---- subscripts -----------------------------------------------------------------------------
@register("BINARY_SUBSCR")
def BINARY_SUBSCR(tx, inst):
    key = tx.pop()
    obj = tx.pop()
    tx.push(tx.getitem(obj, key))


@register("STORE_SUBSCR")
def STORE_SUBSCR(tx, inst):
    key = tx.pop()
    obj = tx.pop()
    value = tx.pop()
    tx.setitem(obj, key, value)


@register("DELETE_SUBSCR")
def DELETE_SUBSCR(tx, inst):
    key = tx.pop()
    obj = tx.pop()
    obj.call_method(tx, "__delitem__", [key], {})


@register("BINARY_SLICE", versions=((3, 12), (3, 13)))
def BINARY_SLICE(tx, inst):
    stop = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    tx.push(tx.getitem(obj, SliceVariable(start, stop, ConstantVariable(None))))


@register("STORE_SLICE", versions=((3, 12), (3, 13)))
def STORE_SLICE(tx, inst):
    stop = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    value = tx.pop()
    tx.setitem(obj, SliceVariable(start, stop, ConstantVariable(None)), value)
