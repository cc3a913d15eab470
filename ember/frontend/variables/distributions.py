"""What ``torch.distributions`` needs beyond ordinary inlining: its argument validation.

A distribution built with validation on (the default under ``__debug__``) checks each parameter
with ``if not torch._is_all_true(constraint.check(value)): raise ValueError(...)``, a branch on
tensor data. torch.compile drops the check from its graph. ember keeps it: called from
torch.distributions' own code, ``torch._is_all_true`` gives a tensor whose truth is assumed (the
trace goes on as for valid arguments) and checked when the graph runs, with
``torch._assert_async``. Invalid arguments then raise a RuntimeError at run time where eager
raises ValueError: an error either way, never a silently wrong distribution. Elsewhere the call is
an ordinary graph op whose truth is a break, as before.
"""
from __future__ import annotations

import torch

from ember.frontend.variables.base import VariableTracker, guard_id, register_rule
from ember.frontend.variables.tensor import TensorVariable

_CHECKED_MODULES = ("torch.distributions.",)


class AssumedTrueTensorVariable(TensorVariable):
    """A bool tensor the program branches on, assumed True while tracing and asserted at run time."""

    def __init__(self, node, fake, what: str):
        super().__init__(node, fake)
        self.what = what

    def truth(self, tx) -> bool:
        # added as a node directly: it returns None, which OutputGraph.call would drop as unused
        node = tx.output.graph.create_node("call_function", torch._assert_async,
                                           (self.node, f"ember: {self.what} failed at run time"))
        node.meta["stack_trace"] = tx.user_location()
        return True


class IsAllTrueVariable(VariableTracker):
    """``torch._is_all_true`` as the trace sees it (see the module docstring)."""

    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source

    def describe(self):
        return "torch._is_all_true"

    def call(self, tx, args, kwargs):
        result = tx.output.call(tx, "call_function", torch._is_all_true, args, kwargs)
        caller = tx.f_globals.get("__name__", "") + "."
        if isinstance(result, TensorVariable) and caller.startswith(_CHECKED_MODULES):
            return AssumedTrueTensorVariable(result.node, result.fake, "a torch.distributions argument check")
        return result

    def reconstruct(self, cg):
        return cg.const(self.fn, "is_all_true")


@register_rule
def _build_is_all_true(tx, value, source):
    if value is torch._is_all_true:
        guard_id(tx, value, source)
        return IsAllTrueVariable(value, source)
    return None
