"""with-blocks, and the exception machinery (only reached when an exception is raised)."""
from __future__ import annotations

from ember.frontend.errors import Unsupported
from ember.frontend.handlers import register, unsupported
from ember.frontend.variables.base import VariableTracker
from ember.frontend.variables.contexts import ContextVariable


class _ContextExit(VariableTracker):
    """The bound ``__exit__`` BEFORE_WITH leaves on the stack for a modelled context."""

    def __init__(self, ctx: ContextVariable):
        self.ctx = ctx

    def call(self, tx, args, kwargs):
        from ember.frontend.variables.base import ConstantVariable

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
    exc = tx.stack[-1] if inst.arg else None
    what = exc.describe() if exc is not None else "re-raise"
    if exc is not None and exc.is_constant() and exc.as_constant() is AssertionError:
        what = "AssertionError (a failed assert)"
    raise Unsupported(f"raising an exception: {what}")


unsupported("PUSH_EXC_INFO", "POP_EXCEPT", "CHECK_EXC_MATCH", "RERAISE", "WITH_EXCEPT_START", "CLEANUP_THROW",
            "CHECK_EG_MATCH", "PREP_RERAISE_STAR",
            reason="exception handling while tracing")
unsupported("GET_AWAITABLE", "GET_AITER", "GET_ANEXT", "END_ASYNC_FOR",
            "BEFORE_ASYNC_WITH", "ASYNC_GEN_WRAP",
            reason="yield from / async code")
unsupported("MATCH_CLASS", "MATCH_MAPPING", "MATCH_SEQUENCE", "MATCH_KEYS", "COPY_DICT_WITHOUT_KEYS",
            reason="structural pattern matching")
