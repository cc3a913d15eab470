"""Handlers for CPython 3.13's bytecode: new opcodes, and opcodes whose stack layout or argument changed.

Every registration here starts at (3, 13), so 3.11 / 3.12 behaviour cannot change; the unchanged
opcodes share their 3.11/3.12 handlers (the default range of ``register`` reaches 3.13).
Semantics follow https://docs.python.org/3.13/library/dis.html. The 3.13 changes that matter here:

* the NULL of a call sits *above* the callable: ``callable, self_or_null, args...`` (3.12:
  ``NULL, callable`` or ``method, self``), so LOAD_GLOBAL / LOAD_ATTR / LOAD_SUPER_ATTR push it after;
* keyword names travel on the stack to CALL_KW instead of through KW_NAMES;
* conditional jumps need an exact bool (TO_BOOL, or COMPARE_OP's bit 16, makes it), so a graph break
  that hands a stack to native code must never leave a non-bool where a jump expects one: the
  conversion happens (and breaks, for a tensor) at TO_BOOL / COMPARE_OP, which native code re-runs;
* MAKE_FUNCTION takes only the code object; SET_FUNCTION_ATTRIBUTE adds defaults, closure, ...;
* FORMAT_VALUE is split into CONVERT_VALUE, FORMAT_SIMPLE and FORMAT_WITH_SPEC;
* END_FOR pops one value, and an exhausted FOR_ITER skips both END_FOR and the POP_TOP after it;
* LOAD_CLOSURE is gone: a closure's cells are loaded with LOAD_FAST of the cell variable's slot.
"""
from __future__ import annotations

from ember.frontend import builtins as B
from ember.frontend.errors import Unsupported
from ember.frontend.handlers import register
from ember.frontend.handlers.calls import CALL_FUNCTION_EX as _call_function_ex_312
from ember.frontend.handlers.containers import _CONVERSIONS
from ember.frontend.handlers.jumps import _next_item
from ember.frontend.handlers.loads_stores import LOAD_FAST as _load_fast_312, STORE_FAST, _getattr
from ember.frontend.interpreter import is_null
from ember.frontend.variables.base import NULL, ConstantVariable
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.functions import NestedFunctionVariable
from ember.frontend.variables.objects import SuperVariable

V313 = ((3, 13), (3, 13))


class _Named:
    """A decoded instruction re-targeted at one local (for the superinstructions' halves)."""
    __slots__ = ("argval",)

    def __init__(self, name):
        self.argval = name


@register("LOAD_FAST", "LOAD_FAST_CHECK", versions=V313)
def LOAD_FAST(tx, inst):
    name = inst.argval
    if name in tx.cells and (name in tx.code.co_cellvars or name in tx.code.co_freevars):
        tx.push(tx.cells[name])  # the cell itself, for a closure tuple (3.12's LOAD_CLOSURE)
    else:
        _load_fast_312(tx, inst)


# ---- superinstructions over locals: argval is the pair of names (dis resolves oparg>>4, oparg&15) --
@register("LOAD_FAST_LOAD_FAST", versions=V313)
def LOAD_FAST_LOAD_FAST(tx, inst):
    first, second = inst.argval
    LOAD_FAST(tx, _Named(first))
    LOAD_FAST(tx, _Named(second))


@register("STORE_FAST_LOAD_FAST", versions=V313)
def STORE_FAST_LOAD_FAST(tx, inst):
    store, load = inst.argval
    STORE_FAST(tx, _Named(store))
    LOAD_FAST(tx, _Named(load))


@register("STORE_FAST_STORE_FAST", versions=V313)
def STORE_FAST_STORE_FAST(tx, inst):
    first, second = inst.argval  # STACK[-1] -> first, STACK[-2] -> second
    STORE_FAST(tx, _Named(first))
    STORE_FAST(tx, _Named(second))


# ---- loads that may push a call's NULL: 3.13 pushes it after the value ------------------------
@register("LOAD_GLOBAL", versions=V313)
def LOAD_GLOBAL(tx, inst):
    tx.push(tx.load_global(inst.argval))
    if inst.arg & 1:
        tx.push(NULL)


@register("LOAD_ATTR", versions=V313)
def LOAD_ATTR(tx, inst):
    attr = _getattr(tx, tx.pop(), inst.argval)
    tx.push(attr)
    if inst.arg & 1:  # method load: [bound, NULL] is equivalent to [method, self] for the tracer
        tx.push(NULL)


@register("LOAD_SUPER_ATTR", versions=V313)
def LOAD_SUPER_ATTR(tx, inst):
    self_vt = tx.pop()
    cls = tx.pop()
    tx.pop()  # the global `super`
    tx.push(_getattr(tx, SuperVariable(cls.as_constant(), self_vt), inst.argval))
    if inst.arg & 1:
        tx.push(NULL)


# ---- calls: stack is callable, self_or_null, args... --------------------------------------------
def _callee(tx, args: list):
    fn, self_or_null = tx.stack[-2], tx.stack[-1]
    del tx.stack[-2:]
    return (fn, args) if is_null(self_or_null) else (fn, [self_or_null, *args])


@register("CALL", versions=V313)
def CALL(tx, inst):
    fn, args = _callee(tx, tx.popn(inst.arg))
    tx.push(fn.call(tx, args, {}))


@register("CALL_KW", versions=V313)
def CALL_KW(tx, inst):
    names = tx.pop().as_constant()
    fn, args = _callee(tx, tx.popn(inst.arg))
    n = len(names)
    kwargs = dict(zip(names, args[len(args) - n:]))
    tx.push(fn.call(tx, args[:len(args) - n], kwargs))


@register("CALL_FUNCTION_EX", versions=V313)
def CALL_FUNCTION_EX(tx, inst):
    # 3.13: func, NULL, callargs[, kwargs]; move the NULL under func and reuse the 3.12 handler
    kwargs = [tx.pop()] if inst.arg & 1 else []
    callargs = tx.pop()
    if is_null(tx.stack[-1]):
        tx.stack[-2], tx.stack[-1] = tx.stack[-1], tx.stack[-2]
    tx.push(callargs)
    for k in kwargs:
        tx.push(k)
    _call_function_ex_312(tx, inst)


# ---- function creation --------------------------------------------------------------------------
@register("MAKE_FUNCTION", versions=V313)
def MAKE_FUNCTION(tx, inst):
    code = tx.pop().as_constant()
    tx.push(NestedFunctionVariable(code, tx.f_globals, code.co_name, code.co_qualname, None, None, None))


_FUNCTION_ATTRIBUTE = {0x01: "defaults", 0x02: "kwdefaults", 0x04: "annotations", 0x08: "closure"}


@register("SET_FUNCTION_ATTRIBUTE", versions=V313)
def SET_FUNCTION_ATTRIBUTE(tx, inst):
    fn = tx.pop()
    value = tx.pop()
    which = _FUNCTION_ATTRIBUTE.get(inst.arg)
    if which == "defaults":
        fn.defaults = tuple(value.unpack(tx))
    elif which == "kwdefaults":
        fn.kwdefaults = dict(value.items) if isinstance(value, DictVariable) else value
    elif which == "closure":
        fn.closure = tuple(value.items)
    elif which is None:  # 0x10 (annotate, 3.14) or unknown: refuse rather than drop it
        raise Unsupported(f"SET_FUNCTION_ATTRIBUTE {inst.arg:#x}")
    # annotations: dropped, as the 3.11/3.12 MAKE_FUNCTION handler drops them
    tx.push(fn)


# ---- truth: conditional jumps need an exact bool on 3.13 ----------------------------------------
@register("TO_BOOL", versions=V313)
def TO_BOOL(tx, inst):
    tx.push(ConstantVariable(bool(tx.pop().truth(tx))))


@register("COMPARE_OP", versions=V313)
def COMPARE_OP(tx, inst):
    b = tx.pop()
    a = tx.pop()
    result = B.apply_operator(tx, B.COMPARE[inst.argval], a, b)  # dis: argval = cmp_op[oparg >> 5]
    if inst.arg & 16:  # "coerce to bool": the compiler folded a TO_BOOL into the compare
        result = ConstantVariable(bool(result.truth(tx)))
    tx.push(result)


# ---- f-strings ---------------------------------------------------------------------------------
def _constant_for_format(value):
    if not value.is_constant():
        raise Unsupported(f"formatting {value.describe()} into a string")
    return value.as_constant()


@register("CONVERT_VALUE", versions=V313)
def CONVERT_VALUE(tx, inst):
    v = _constant_for_format(tx.pop())
    tx.push(ConstantVariable(_CONVERSIONS[inst.arg](v)))


@register("FORMAT_SIMPLE", versions=V313)
def FORMAT_SIMPLE(tx, inst):
    tx.push(ConstantVariable(format(_constant_for_format(tx.pop()), "")))


@register("FORMAT_WITH_SPEC", versions=V313)
def FORMAT_WITH_SPEC(tx, inst):
    spec = tx.pop().as_constant()
    v = _constant_for_format(tx.pop())
    tx.push(ConstantVariable(format(v, spec)))


# ---- loops -------------------------------------------------------------------------------------
@register("FOR_ITER", versions=V313)
def FOR_ITER(tx, inst):
    item = _next_item(tx, tx.stack[-1])
    if item is None:
        tx.pop()
        tx.ip = inst.target + 2  # an exhausted 3.13 FOR_ITER skips END_FOR and the POP_TOP after it
    else:
        tx.push(item)


@register("END_FOR", versions=V313)
def END_FOR(tx, inst):
    tx.pop()  # 3.13: END_FOR is POP_TOP (3.12 popped two)
