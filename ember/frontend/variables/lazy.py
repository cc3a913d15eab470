"""Values a resumed frame receives (its locals and stack slots) that the trace has not looked at yet.

A resume function or loop segment gets the whole frame, but a graph only depends on what the traced
code reads. Building every value up front would guard on all of them: a loop segment would then
recompile for each new value of a Python float the body only passes on (the ``.item()`` it printed),
a loop index, a string. So a resumed frame's values start as ``LazyVariable``: built (and guarded)
by the instruction that first uses them, and otherwise handed on to the next continuation as they
are, loaded from where they came from.

``PassThroughVariable`` is a value the trace must never use: a driven loop's iterator (the driver
iterates it natively) or a with-block's exit around that loop.
"""
from __future__ import annotations

from ember.frontend.errors import Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import ItemSource
from ember.frontend.variables.base import VariableTracker, guard


class LazyVariable(VariableTracker):
    def __init__(self, value, source):
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"{self.source.name()} (not read yet)"

    def realize(self, tx) -> VariableTracker:
        if type(self.value) in (int, float) and getattr(tx, "scope", None) is not None and \
                tx.output.shapes.scalar_changed(self.source.name(), self.value):
            # a loop's counter, an .item() result: a new value every iteration. Guarded as a constant
            # it would recompile the segment each time; the statement using it runs as Python instead
            raise Unsupported(f"{self.source.name()} is a Python number that changes between iterations",
                              hint="the statement that uses it runs as Python; the rest of the body stays compiled")
        return VariableTracker.build(tx, self.value, self.source)


class PassThroughVariable(VariableTracker):
    def __init__(self, value, source):
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"{type(self.value).__name__} the loop's driver owns"


# instructions that only move a value, so a lazy one stays lazy through them
_MOVES = frozenset({"STORE_FAST", "POP_TOP", "NOP", "SWAP", "COPY", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_CONST",
                    "LOAD_GLOBAL", "LOAD_DEREF", "JUMP_FORWARD", "JUMP_BACKWARD", "RESUME", "RETURN_VALUE",
                    "PUSH_NULL", "RETURN_CONST",
                    "LOAD_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST", "STORE_FAST_LOAD_FAST"})  # 3.13


def realize(tx, v):
    return v.realize(tx) if isinstance(v, LazyVariable) else v


def settle_stack(tx, inst) -> None:
    """Before ``inst`` runs: build the lazy values on the stack it may use. Unpacking a lazy tuple
    yields lazy items (``for i, (k, v) in enumerate(d.items())`` guards only what the body reads)."""
    if inst.opname in _MOVES:
        return
    stack = tx.stack
    if inst.opname == "UNPACK_SEQUENCE" and stack and isinstance(stack[-1], LazyVariable):
        top = stack[-1]
        if type(top.value) is tuple and len(top.value) == inst.arg:
            guard(tx, top.source, GuardKind.TYPE, tuple)
            guard(tx, top.source, GuardKind.LEN, len(top.value))
            stack[-1] = _LazyTuple(top)
    for i, v in enumerate(stack):
        if isinstance(v, LazyVariable):
            stack[i] = v.realize(tx)
    tx.lazy_stack = any(isinstance(v, _LazyTuple) for v in stack)


class _LazyTuple(VariableTracker):
    """A tuple read from the frame whose items stay lazy (UNPACK_SEQUENCE asks for them)."""

    def __init__(self, lazy: LazyVariable):
        self.lazy = lazy
        self.source = lazy.source

    def unpack(self, tx) -> list:
        return [LazyVariable(v, ItemSource(self.source, i)) for i, v in enumerate(self.lazy.value)]

    def describe(self) -> str:
        return self.lazy.describe()
