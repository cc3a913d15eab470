"""Building tuples, lists, sets, dicts, slices and strings; unpacking."""
from __future__ import annotations

from ember.frontend.builtins import dict_items_of
from ember.frontend.errors import Unsupported
from ember.frontend.handlers import register
from ember.frontend.variables.base import ConstantVariable
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.sequences import ListVariable, SliceVariable, TupleVariable
from ember.frontend.variables.sets import SetVariable


@register("BUILD_TUPLE")
def BUILD_TUPLE(tx, inst):
    tx.push(TupleVariable(tx.popn(inst.arg)))


@register("BUILD_LIST")
def BUILD_LIST(tx, inst):
    tx.push(ListVariable(tx.popn(inst.arg)))


@register("BUILD_SET")
def BUILD_SET(tx, inst):
    tx.push(SetVariable(tx.popn(inst.arg)))


@register("BUILD_MAP")
def BUILD_MAP(tx, inst):
    flat = tx.popn(2 * inst.arg)
    d = DictVariable({})
    for k, v in zip(flat[::2], flat[1::2]):
        d.setitem(tx, k, v)
    tx.push(d)


@register("BUILD_CONST_KEY_MAP")
def BUILD_CONST_KEY_MAP(tx, inst):
    keys = tx.pop().as_constant()
    values = tx.popn(inst.arg)
    tx.push(DictVariable(dict(zip(keys, values))))


@register("BUILD_SLICE")
def BUILD_SLICE(tx, inst):
    parts = tx.popn(inst.arg)
    if len(parts) == 2:
        parts.append(ConstantVariable(None))
    tx.push(SliceVariable(*parts))


@register("LIST_APPEND")
def LIST_APPEND(tx, inst):
    v = tx.pop()
    tx.stack[-inst.arg].items.append(v)


@register("SET_ADD")
def SET_ADD(tx, inst):
    v = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "add", [v], {})


@register("MAP_ADD")
def MAP_ADD(tx, inst):
    v = tx.pop()
    k = tx.pop()
    tx.stack[-inst.arg].setitem(tx, k, v)


@register("LIST_EXTEND")
def LIST_EXTEND(tx, inst):
    v = tx.pop()
    tx.stack[-inst.arg].items.extend(v.unpack(tx))


@register("SET_UPDATE")
def SET_UPDATE(tx, inst):
    v = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "update", [v], {})


@register("DICT_UPDATE", "DICT_MERGE")
def DICT_UPDATE(tx, inst):
    v = tx.pop()
    target = tx.stack[-inst.arg]
    for k, val in dict_items_of(tx, v):
        if inst.opname == "DICT_MERGE" and k.is_constant() and k.as_constant() in target.items:
            raise Unsupported(f"got multiple values for keyword argument '{k.as_constant()}' (TypeError)")
        target.setitem(tx, k, val)


@register("LIST_TO_TUPLE", versions=((3, 11), (3, 11)))
def LIST_TO_TUPLE(tx, inst):
    tx.push(TupleVariable(tx.pop().unpack(tx)))


@register("UNPACK_SEQUENCE")
def UNPACK_SEQUENCE(tx, inst):
    seq = tx.pop()
    items = seq.unpack(tx)
    if len(items) != inst.arg:
        raise Unsupported(f"cannot unpack {len(items)} values into {inst.arg} (ValueError)")
    for v in reversed(items):
        tx.push(v)


@register("UNPACK_EX")
def UNPACK_EX(tx, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = tx.pop().unpack(tx)
    if len(items) < before + after:
        raise Unsupported(f"not enough values to unpack (ValueError)")
    head = items[:before]
    mid = items[before:len(items) - after]
    tail = items[len(items) - after:]
    for v in reversed(tail):
        tx.push(v)
    tx.push(ListVariable(mid))
    for v in reversed(head):
        tx.push(v)


_CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}


@register("FORMAT_VALUE", versions=((3, 11), (3, 12)))
def FORMAT_VALUE(tx, inst):
    spec = tx.pop().as_constant() if inst.arg & 0x04 else ""
    value = tx.pop()
    if not value.is_constant():
        raise Unsupported(f"formatting {value.describe()} into a string")
    v = value.as_constant()
    conv = _CONVERSIONS[inst.arg & 0x03]
    if conv is not None:
        v = conv(v)
    tx.push(ConstantVariable(format(v, spec)))


@register("BUILD_STRING")
def BUILD_STRING(tx, inst):
    parts = tx.popn(inst.arg)
    tx.push(ConstantVariable("".join(p.as_constant() for p in parts)))


@register("GET_LEN")
def GET_LEN(tx, inst):
    tx.push(ConstantVariable(tx.stack[-1].length(tx)))
