"""with-blocks, and the exception machinery: ``raise`` and the opcodes of ``except`` clauses, reached
when a traced exception is caught (``InstructionTranslator.catch`` jumps to the handler)."""
from __future__ import annotations

from ember.frontend.errors import Unsupported
from ember.frontend.handlers import register, unsupported
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.contexts import ContextVariable
from ember.frontend.variables.exceptions import to_traced


class _ContextExit(VariableTracker):
    """The bound ``__exit__`` BEFORE_WITH leaves on the stack for a modelled context."""

    def __init__(self, ctx: ContextVariable):
        self.ctx = ctx

    def call(self, tx, args, kwargs):
        self.ctx.exit(tx)
        return ConstantVariable(None)

    def reconstruct(self, cg) -> str:
        # on the stack across a graph break: the entry re-entered the context (BreakCall)
        return self.ctx.exit_callable(cg)


@register("BEFORE_WITH")
def BEFORE_WITH(tx, inst):
    ctx = tx.pop()
    if isinstance(ctx, ContextVariable):
        tx.push(_ContextExit(ctx))
        tx.push(ctx.enter(tx))
        return
    try:
        exit_fn = ctx.getattr(tx, "__exit__")
        enter_fn = ctx.getattr(tx, "__enter__")
    except AttributeError:
        raise Unsupported(f"{ctx.describe()} is not a context manager (TypeError)") from None
    tx.push(exit_fn)
    tx.push(enter_fn.call(tx, [], {}))


@register("RAISE_VARARGS")
def RAISE_VARARGS(tx, inst):
    if inst.arg == 0:  # bare `raise`: the exception being handled
        if not tx.exc_stack:
            raise Unsupported("re-raising outside an except block of the traced function")
        raise to_traced(tx, tx.exc_stack[-1], reraise=True)
    cause = tx.pop() if inst.arg == 2 else None  # `raise X from Y`
    raise to_traced(tx, tx.pop(), cause)


@register("PUSH_EXC_INFO")
def PUSH_EXC_INFO(tx, inst):
    exc = tx.pop()
    tx.push(tx.exc_stack[-1] if tx.exc_stack else ConstantVariable(None))
    tx.push(exc)
    tx.exc_stack.append(exc)


@register("POP_EXCEPT")
def POP_EXCEPT(tx, inst):
    tx.pop()
    tx.exc_stack.pop()


@register("CHECK_EXC_MATCH")
def CHECK_EXC_MATCH(tx, inst):
    match = tx.pop()
    classes = match.as_constant() if match.is_constant() else tuple(c.as_constant() for c in match.unpack(tx))
    tx.push(ConstantVariable(issubclass(tx.stack[-1].python_type(), classes)))


@register("RERAISE")
def RERAISE(tx, inst):
    exc = tx.pop()
    if inst.arg:
        tx.pop()  # lasti: where the exception was raised, for the traceback
    raise to_traced(tx, exc, reraise=True)


@register("WITH_EXCEPT_START")
def WITH_EXCEPT_START(tx, inst):
    """A with-block left by an exception: ``__exit__(type, value, None)``, below [lasti, prev_exc, value]."""
    exit_fn, exc = tx.stack[-4], tx.stack[-1]
    tx.push(exit_fn.call(tx, [VariableTracker.build_object(tx, exc.python_type()), exc, ConstantVariable(None)], {}))


unsupported("CLEANUP_THROW", "CHECK_EG_MATCH", "PREP_RERAISE_STAR", reason="exception handling while tracing")
unsupported("GET_AWAITABLE", "GET_AITER", "GET_ANEXT", "END_ASYNC_FOR",
            "BEFORE_ASYNC_WITH", "ASYNC_GEN_WRAP",
            reason="yield from / async code")
unsupported("MATCH_CLASS", "MATCH_MAPPING", "MATCH_SEQUENCE", "MATCH_KEYS", "COPY_DICT_WITHOUT_KEYS",
            reason="structural pattern matching")
