"""Locals, globals, cells, constants, attributes, and plain stack shuffling."""
from __future__ import annotations

from ember.frontend.errors import TracedException, Unsupported
from ember.frontend.handlers import register, unsupported
from ember.frontend.interpreter import CellVariable
from ember.frontend.variables.base import NULL, ConstantVariable, VariableTracker, guard_no_attr
from ember.frontend.variables.lazy import LazyVariable, realize
from ember.frontend.variables.objects import SuperVariable


# https://docs.python.org/3/library/dis.html#opcode-NOP
@register("NOP", "RESUME", "PRECALL", "CACHE", "EXTENDED_ARG", "COPY_FREE_VARS")
def NOP(tx, inst):
    pass


@register("POP_TOP")
def POP_TOP(tx, inst):
    tx.pop()


@register("PUSH_NULL")
def PUSH_NULL(tx, inst):
    tx.push(NULL)


@register("COPY")
def COPY(tx, inst):
    tx.push(tx.stack[-inst.arg])


@register("SWAP")
def SWAP(tx, inst):
    s = tx.stack
    s[-1], s[-inst.arg] = s[-inst.arg], s[-1]


@register("LOAD_CONST")
def LOAD_CONST(tx, inst):
    tx.push(VariableTracker.const(inst.argval))


_UNBOUND = object()


@register("LOAD_FAST", "LOAD_FAST_CHECK", versions=((3, 11), (3, 12)))  # 3.13: handlers/py313.py
def LOAD_FAST(tx, inst):
    v = tx.locals.get(inst.argval, _UNBOUND)
    if v is _UNBOUND:
        raise Unsupported(f"local variable '{inst.argval}' referenced before assignment (UnboundLocalError)")
    if isinstance(v, LazyVariable):  # a resumed frame's value, first read here
        v = tx.locals[inst.argval] = v.realize(tx)
    tx.push(v)


@register("LOAD_FAST_AND_CLEAR", versions=((3, 12), (3, 13)))
def LOAD_FAST_AND_CLEAR(tx, inst):
    # 3.12 inlined comprehensions save the outer binding (possibly unbound) and restore it after.
    tx.push(realize(tx, tx.locals.pop(inst.argval, NULL)))


@register("STORE_FAST")
def STORE_FAST(tx, inst):
    v = tx.pop()
    if v is NULL:
        tx.locals.pop(inst.argval, None)
    else:
        tx.locals[inst.argval] = v


@register("DELETE_FAST")
def DELETE_FAST(tx, inst):
    tx.locals.pop(inst.argval, None)


@register("LOAD_GLOBAL", versions=((3, 11), (3, 12)))
def LOAD_GLOBAL(tx, inst):
    if inst.arg & 1:
        tx.push(NULL)
    tx.push(tx.load_global(inst.argval))


@register("STORE_GLOBAL")
def STORE_GLOBAL(tx, inst):
    tx.store_global(inst.argval, tx.pop())


@register("DELETE_GLOBAL")
def DELETE_GLOBAL(tx, inst):
    raise Unsupported(f"deleting global '{inst.argval}'")


# ---- cells ----------------------------------------------------------------------------------
@register("MAKE_CELL")
def MAKE_CELL(tx, inst):
    name = inst.argval
    if name in tx.locals:
        cell = CellVariable(realize(tx, tx.locals.pop(name)))
    else:
        cell = CellVariable()
    cell.owner = (tx.code, name)  # which frame's variable: a closure over it may cross a graph break
    tx.cells[name] = cell


@register("LOAD_CLOSURE")
def LOAD_CLOSURE(tx, inst):
    tx.push(tx.cells[inst.argval])


@register("LOAD_DEREF", "LOAD_CLASSDEREF")
def LOAD_DEREF(tx, inst):
    tx.push(tx.cells[inst.argval].load(tx, inst.argval))


@register("STORE_DEREF")
def STORE_DEREF(tx, inst):
    tx.cells[inst.argval].store(tx, inst.argval, tx.pop())


@register("DELETE_DEREF")
def DELETE_DEREF(tx, inst):
    cell = tx.cells[inst.argval]
    if not isinstance(cell, CellVariable):
        raise Unsupported(f"deleting nonlocal '{inst.argval}'")
    cell.contents = CellVariable.EMPTY


# ---- attributes -----------------------------------------------------------------------------
def _getattr(tx, obj, name):
    try:
        return obj.getattr(tx, name)
    except AttributeError as exc:
        guard_no_attr(tx, obj, name)  # an `except AttributeError` may go on without it
        raise TracedException(AttributeError, [ConstantVariable(str(exc))],
                              f"{obj.describe()} has no attribute '{name}' (AttributeError: {exc})") from None


@register("LOAD_ATTR", versions=((3, 11), (3, 11)))
def LOAD_ATTR_311(tx, inst):
    tx.push(_getattr(tx, tx.pop(), inst.argval))


@register("LOAD_ATTR", versions=((3, 12), (3, 12)))
def LOAD_ATTR_312(tx, inst):
    obj = tx.pop()
    attr = _getattr(tx, obj, inst.argval)
    if inst.arg & 1:  # method load: [NULL, bound] is equivalent to [method, self] for the tracer
        tx.push(NULL)
    tx.push(attr)


@register("LOAD_METHOD", versions=((3, 11), (3, 11)))
def LOAD_METHOD(tx, inst):
    obj = tx.pop()
    tx.push(NULL)
    tx.push(_getattr(tx, obj, inst.argval))


@register("LOAD_SUPER_ATTR", versions=((3, 12), (3, 12)))
def LOAD_SUPER_ATTR(tx, inst):
    self_vt = tx.pop()
    cls = tx.pop()
    tx.pop()  # the global `super`

    sup = SuperVariable(cls.as_constant(), self_vt)
    attr = _getattr(tx, sup, inst.argval)
    if inst.arg & 1:
        tx.push(NULL)
    tx.push(attr)


@register("STORE_ATTR")
def STORE_ATTR(tx, inst):
    obj = tx.pop()
    value = tx.pop()
    obj.setattr(tx, inst.argval, value)


@register("DELETE_ATTR")
def DELETE_ATTR(tx, inst):
    tx.pop().delattr(tx, inst.argval)


@register("LOAD_ASSERTION_ERROR")
def LOAD_ASSERTION_ERROR(tx, inst):
    tx.push(VariableTracker.build_object(tx, AssertionError))


# ---- imports inside functions (idempotent: the module is already in sys.modules or loads once) --
@register("IMPORT_NAME")
def IMPORT_NAME(tx, inst):
    fromlist = tx.pop().as_constant()
    level = tx.pop().as_constant()
    mod = __import__(inst.argval, tx.f_globals, None, fromlist, level)

    tx.push(VariableTracker.build_object(tx, mod))


@register("IMPORT_FROM")
def IMPORT_FROM(tx, inst):
    tx.push(_getattr(tx, tx.stack[-1], inst.argval))


unsupported("IMPORT_STAR", "LOAD_NAME", "STORE_NAME", "DELETE_NAME", "LOAD_BUILD_CLASS", "SETUP_ANNOTATIONS",
            "LOAD_LOCALS", "LOAD_FROM_DICT_OR_GLOBALS", "LOAD_FROM_DICT_OR_DEREF",
            reason="module- or class-level bytecode inside a compiled function")
