"""Calls and function creation."""
from __future__ import annotations

from ember.frontend.builtins import dict_items_of
from ember.frontend.errors import Unsupported
from ember.frontend.handlers import register
from ember.frontend.interpreter import is_null
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.functions import NestedFunctionVariable
from ember.frontend.variables.sequences import TupleVariable


@register("KW_NAMES", versions=((3, 11), (3, 12)))
def KW_NAMES(tx, inst):
    tx.kw_names = tx.code.co_consts[inst.arg]  # dis leaves argval unresolved on 3.11


@register("CALL", versions=((3, 11), (3, 12)))
def CALL(tx, inst):
    args = tx.popn(inst.arg)
    below, top = tx.stack[-2], tx.stack[-1]
    del tx.stack[-2:]
    if is_null(below):
        fn = top
    else:  # [method, self, args...]
        fn = below
        args = [top, *args]
    kwargs = {}
    if tx.kw_names:
        n = len(tx.kw_names)
        kwargs = dict(zip(tx.kw_names, args[-n:]))
        args = args[:-n]
        tx.kw_names = ()
    tx.push(fn.call(tx, args, kwargs))


@register("CALL_FUNCTION_EX", versions=((3, 11), (3, 12)))
def CALL_FUNCTION_EX(tx, inst):
    kwargs_vt = tx.pop() if inst.arg & 1 else None
    args_vt = tx.pop()
    fn = tx.pop()
    if tx.stack and is_null(tx.stack[-1]):
        tx.pop()
    args = args_vt.unpack(tx)
    kwargs = {}
    if kwargs_vt is not None:
        for k, v in dict_items_of(tx, kwargs_vt):
            kwargs[k.as_constant()] = v
    tx.push(fn.call(tx, args, kwargs))


_MAKE_FUNCTION_DEFAULTS = 0x01
_MAKE_FUNCTION_KWDEFAULTS = 0x02
_MAKE_FUNCTION_ANNOTATIONS = 0x04
_MAKE_FUNCTION_CLOSURE = 0x08


@register("MAKE_FUNCTION", versions=((3, 11), (3, 12)))
def MAKE_FUNCTION(tx, inst):
    code = tx.pop().as_constant()
    flags = inst.arg
    closure = tx.pop().items if flags & _MAKE_FUNCTION_CLOSURE else None
    if flags & _MAKE_FUNCTION_ANNOTATIONS:
        tx.pop()
    kwdefaults = tx.pop() if flags & _MAKE_FUNCTION_KWDEFAULTS else None
    defaults = tx.pop() if flags & _MAKE_FUNCTION_DEFAULTS else None
    if isinstance(kwdefaults, DictVariable):
        kwdefaults = dict(kwdefaults.items)
    if defaults is not None:
        defaults = tuple(defaults.unpack(tx))
    tx.push(NestedFunctionVariable(code, tx.f_globals, code.co_name, code.co_qualname, defaults, kwdefaults,
                                   tuple(closure) if closure is not None else None))
