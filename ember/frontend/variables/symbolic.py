"""Symbolic sizes: a Python int that is a symbol of the frame's ShapeEnv (``x.shape[0]`` of a dynamic
dimension, ``n * 2`` of a dynamic int argument).

A ``SymIntVariable`` is an FX node computing the int from the graph inputs, plus its ``torch.SymInt``.
Arithmetic with other ints stays symbolic (one node per operation); everything that needs a concrete
Python value (a comparison, ``range()``, a dict key, a call into non-torch code) *specializes*: it asks
the ShapeEnv for the int, which records a guard (``s0 == 8``, ``s0 > 4``) that the entry function
checks. Specializing is never wrong, only less general, so it is the fallback for every use this
module does not handle.
"""
from __future__ import annotations

import operator

import torch

from ember.frontend.dynamic import is_symbolic, render_expr
from ember.frontend.variables.base import ConstantVariable, VariableTracker, helpers

_INPLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
            operator.ifloordiv: operator.floordiv, operator.imod: operator.mod, operator.ipow: operator.pow,
            operator.itruediv: operator.truediv, operator.ilshift: operator.lshift, operator.irshift: operator.rshift,
            operator.iand: operator.and_, operator.ior: operator.or_, operator.ixor: operator.xor}


class SymIntVariable(VariableTracker):
    def __init__(self, node, sym: torch.SymInt, source=None):
        self.node = node
        self.sym = sym
        self.source = source

    def python_type(self) -> type:
        return int

    def describe(self) -> str:
        return f"symbolic int {self.sym}"

    # Treated as a constant by code that only needs a value: that value is specialized (and guarded).
    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> int:
        return int(self.sym)

    def is_symbolic(self) -> bool:
        return True

    def as_node_arg(self):
        return self.node

    def as_fake_arg(self):
        return self.sym

    def truth(self, tx) -> bool:
        return bool(self.sym != 0)

    def getattr(self, tx, name: str) -> VariableTracker:
        return ConstantVariable(self.as_constant()).getattr(tx, name)

    def reconstruct(self, cg) -> str:
        # the entry function binds every input symbol (``__sym_s0 = x.size(0)``) before the graph
        # runs, so the value is an expression over them
        return f"({render_expr(self.sym.node.expr)})"


def wrap_sym(tx, node, value) -> VariableTracker:
    """A tracker for an int-like result of a graph operation (symbolic, or a plain constant)."""
    if isinstance(value, torch.SymInt) and is_symbolic(value):
        node.meta["example_value"] = value
        return SymIntVariable(node, value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        value = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)](value)
    return ConstantVariable(value)


@helpers.add
def size_item(tx, tensor_vt, kind: str, dim: int) -> VariableTracker:
    """``x.size(dim)`` / ``x.stride(dim)`` of a traced tensor: a constant, or a symbolic int whose node
    reads it from the tensor at run time."""
    value = getattr(tensor_vt.fake, kind)(dim)
    if not is_symbolic(value):
        return ConstantVariable(int(value))
    op = torch.ops.aten.sym_size.int if kind == "size" else torch.ops.aten.sym_stride.int
    node = tx.output.graph.call_function(op, (tensor_vt.node, dim))
    node.meta["example_value"] = value
    return SymIntVariable(node, value)


def binary(tx, fn, a: VariableTracker, b: VariableTracker) -> VariableTracker:
    """``fn(a, b)`` where one side is a SymIntVariable and neither is a tensor."""
    fn = _INPLACE.get(fn, fn)  # ints are immutable: `n += 1` rebinds
    for v in (a, b):
        if not isinstance(v, SymIntVariable) and not (v.is_constant() and type(v.as_constant()) in (int, bool, float)):
            # a sequence (`(1,) * n`), None, ...: the value is needed

            sa = ConstantVariable(a.as_constant()) if isinstance(a, SymIntVariable) else a
            sb = ConstantVariable(b.as_constant()) if isinstance(b, SymIntVariable) else b
            return helpers.apply_operator(tx, fn, sa, sb)
    result = fn(a.as_fake_arg() if isinstance(a, SymIntVariable) else a.as_constant(),
                b.as_fake_arg() if isinstance(b, SymIntVariable) else b.as_constant())
    if isinstance(result, torch.SymInt) and is_symbolic(result):
        node = tx.output.graph.call_function(fn, (_arg(a), _arg(b)))
        return wrap_sym(tx, node, result)
    # comparisons (SymBool) and true division (SymFloat) specialize here: guarded
    return wrap_sym(tx, None, result)


def unary(tx, fn, x: SymIntVariable) -> VariableTracker:
    if fn in (operator.neg, operator.pos, abs, operator.abs):
        result = fn(x.sym)
        if isinstance(result, torch.SymInt) and is_symbolic(result):
            return wrap_sym(tx, tx.output.graph.call_function(fn, (x.node,)), result)
        return wrap_sym(tx, None, result)
    if fn is operator.not_:
        return ConstantVariable(not x.truth(tx))
    return ConstantVariable(fn(x.as_constant()))


def _arg(v: VariableTracker):
    return v.node if isinstance(v, SymIntVariable) else v.as_constant()
