"""``torch.autograd.Function.apply`` of a user Function.

Where no gradient can flow (grad mode off, or no tensor argument requires grad) ``apply`` computes
exactly what ``forward`` computes, so ``forward`` is inlined into the graph with a context object
made in the trace (``ctx.save_for_backward`` and friends are plain Python on it). Where a gradient
could flow, the graph would have to carry the user's ``backward``: ember does not capture that, so the
call is a graph break and ``apply`` runs as Python.
"""
from __future__ import annotations

import types

import torch
from torch.autograd.function import FunctionCtx, _is_setup_context_defined

from ember.frontend.errors import Unsupported
from ember.frontend.variables.base import ConstantVariable, VariableTracker, helpers, trackers
from ember.frontend.variables.objects import NewObjectVariable
from ember.frontend.variables.sequences import BaseSequenceVariable, TupleVariable
from ember.frontend.variables.tensor import TensorVariable


def _leaves(vts) -> list:
    out = []
    for v in vts:
        if isinstance(v, BaseSequenceVariable):
            out += _leaves(v.items)
        else:
            out.append(v)
    return out


@helpers.add
def apply_function(tx, cls_vt: VariableTracker, args: list, kwargs: dict) -> VariableTracker:
    cls = cls_vt.as_constant()
    tensors = [v for v in _leaves([*args, *kwargs.values()]) if isinstance(v, TensorVariable)]
    if torch.is_grad_enabled() and any(t.fake.requires_grad for t in tensors):
        raise Unsupported(f"{cls.__qualname__}.apply with inputs that require grad (the graph cannot carry "
                          "a custom backward)", hint="call it under torch.no_grad(), or outside the compiled function")
    ctx = NewObjectVariable(FunctionCtx)
    ctx.attrs["needs_input_grad"] = ConstantVariable(tuple(False for _ in args))

    def static(name):  # forward and setup_context are staticmethods
        fn = getattr(cls, name)
        if not isinstance(fn, types.FunctionType):
            raise Unsupported(f"{cls.__qualname__}.{name} is not a Python function")
        return trackers.UserFunctionVariable(fn, tx.output.object_source(fn, f"{cls.__qualname__}.{name}"))

    if _is_setup_context_defined(cls.setup_context):
        out = static("forward").call(tx, list(args), dict(kwargs))
        static("setup_context").call(tx, [ctx, TupleVariable(list(args)), out], {})
    else:
        out = static("forward").call(tx, [ctx, *args], dict(kwargs))
    return _fresh_outputs(tx, out, {id(t.node) for t in tensors})


def _fresh_outputs(tx, out, input_nodes: set):
    """``apply`` never hands back an input tensor object: an input returned as is comes back as a view."""
    if isinstance(out, TensorVariable) and id(out.node) in input_nodes:
        return tx.output.call(tx, "call_method", "view_as", [out, out], {})
    if isinstance(out, TupleVariable):
        return TupleVariable([_fresh_outputs(tx, o, input_nodes) for o in out.items])
    return out

