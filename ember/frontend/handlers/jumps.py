"""Jumps and loops. Branches on Python values are decided while tracing; loops are unrolled."""
from __future__ import annotations

from ember.frontend.errors import Unsupported
from ember.frontend.handlers import register
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.iterators import next_of


@register("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT")
def JUMP(tx, inst):
    tx.jump(inst)


def _is_none(v) -> bool:
    return v.is_constant() and v.as_constant() is None


def _pop_jump(predicate):
    def handler(tx, inst):
        if predicate(tx, tx.pop()):
            tx.jump(inst)

    return handler


_if_true = _pop_jump(lambda tx, v: v.truth(tx))
_if_false = _pop_jump(lambda tx, v: not v.truth(tx))
_if_none = _pop_jump(lambda tx, v: _is_none(v))
_if_not_none = _pop_jump(lambda tx, v: not _is_none(v))

register("POP_JUMP_IF_TRUE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE")(_if_true)
register("POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE")(_if_false)
register("POP_JUMP_IF_NONE", "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE")(_if_none)
register("POP_JUMP_IF_NOT_NONE", "POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE")(_if_not_none)


@register("JUMP_IF_TRUE_OR_POP", versions=((3, 11), (3, 11)))
def JUMP_IF_TRUE_OR_POP(tx, inst):
    if tx.stack[-1].truth(tx):
        tx.jump(inst)
    else:
        tx.pop()


@register("JUMP_IF_FALSE_OR_POP", versions=((3, 11), (3, 11)))
def JUMP_IF_FALSE_OR_POP(tx, inst):
    if not tx.stack[-1].truth(tx):
        tx.jump(inst)
    else:
        tx.pop()


@register("GET_ITER")
def GET_ITER(tx, inst):
    tx.push(tx.pop().iter(tx))


def _next_item(tx, it):
    return next_of(tx, it)


@register("FOR_ITER", versions=((3, 11), (3, 11)))
def FOR_ITER_311(tx, inst):
    item = _next_item(tx, tx.stack[-1])
    if item is None:
        tx.pop()
        tx.jump(inst)
    else:
        tx.push(item)


@register("FOR_ITER", versions=((3, 12), (3, 12)))
def FOR_ITER_312(tx, inst):
    item = _next_item(tx, tx.stack[-1])
    if item is None:
        tx.pop()
        tx.ip = inst.target + 1  # an exhausted FOR_ITER skips the END_FOR at its target
    else:
        tx.push(item)


@register("END_FOR", versions=((3, 12), (3, 12)))
def END_FOR(tx, inst):
    tx.pop()
    tx.pop()


@register("RETURN_VALUE")
def RETURN_VALUE(tx, inst):
    tx.returned = tx.pop()


@register("RETURN_CONST", versions=((3, 12), (3, 13)))
def RETURN_CONST(tx, inst):
    tx.returned = VariableTracker.const(inst.argval)


# ---- generators: suspended at each yield, resumed by the consumer's next() ------------------
@register("RETURN_GENERATOR")
def RETURN_GENERATOR(tx, inst):
    if not tx.in_generator:
        raise Unsupported("a generator function as the compiled function")
    tx.push(ConstantVariable(None))


@register("YIELD_VALUE")
def YIELD_VALUE(tx, inst):
    tx.yielded = tx.pop()  # ends this run of the frame's loop
    tx.push(ConstantVariable(None))  # the value next() sends in when it resumes the frame


# ---- yield from (inside a generator frame: each item the sub-iterator gives is yielded on) ------
@register("GET_YIELD_FROM_ITER")
def GET_YIELD_FROM_ITER(tx, inst):
    tx.push(tx.pop().iter(tx))


@register("SEND", versions=((3, 11), (3, 11)))
def SEND_311(tx, inst):
    tx.pop()  # the value sent in (always None here)
    item = _next_item(tx, tx.stack[-1])
    if item is None:
        tx.pop()
        tx.push(ConstantVariable(None))  # the sub-generator's return value
        tx.jump(inst)
    else:
        tx.push(item)


@register("SEND", versions=((3, 12), (3, 13)))
def SEND_312(tx, inst):
    tx.pop()
    item = _next_item(tx, tx.stack[-1])
    if item is None:
        tx.push(ConstantVariable(None))
        tx.jump(inst)
    else:
        tx.push(item)


@register("END_SEND", versions=((3, 12), (3, 13)))
def END_SEND(tx, inst):
    del tx.stack[-2]
