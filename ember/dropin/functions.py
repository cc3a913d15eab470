"""The ``torch._dynamo`` and ``torch.compiler`` functions ``ember run`` provides, with torch's
signatures, implemented with ember (tables.py describes each)."""
from __future__ import annotations

import functools

import torch

import ember
from ember.diagnostics.logging import notice_once


def _noted(name: str, text: str) -> None:
    notice_once(("dynamo-fn", name), f"{name}: {text}")


def mark_dynamic(t, index, *, hint_override=None, min=None, max=None, specialize_on=None):
    if specialize_on is not None:
        _noted("torch._dynamo.mark_dynamic(specialize_on=...)", "ignored; the dimension is one symbol")
    if hint_override is not None:
        _noted("torch._dynamo.mark_dynamic(hint_override=...)", "ignored")
    ember.mark_dynamic(t, index, min=min, max=max)


def maybe_mark_dynamic(t, index):
    ember.maybe_mark_dynamic(t, index)


def mark_static(t, index=None):
    if isinstance(t, torch.nn.Module) or isinstance(t, type):
        _noted("torch._dynamo.mark_static(module)", "ignored; ember treats module attributes as constants")
        return
    ember.mark_static(t, index)


def mark_static_address(t, guard=False):
    _noted("torch._dynamo.mark_static_address", "no effect in ember")


def disable(fn=None, recursive=True, *, reason=None, wrapping=True):
    return ember.disable(fn, recursive, reason=reason)


def _never_traced(msg: str = "") -> None:
    """The body of graph_break: ember.disable'd, so a call inside compiled code is a graph break."""


graph_break = ember.disable(_never_traced, reason="torch._dynamo.graph_break()")


def assume_constant_result(fn):
    _noted("torch._dynamo.assume_constant_result", "the function is called as usual (same results)")
    return fn


def explain(f, *extra_args, **extra_kwargs):
    """torch._dynamo.explain(f)(*args) (or the older explain(f, *args)): ember's report, whose
    graph_count, graph_break_count, break_reasons, op_count, ops_per_graph and out match torch's names."""
    run = ember.explain(f)
    if extra_args or extra_kwargs:
        return run(*extra_args, **extra_kwargs)
    return run


def optimize(backend="inductor", *, nopython=False, dynamic=None, disable=False, guard_filter_fn=None,
             **ignored):
    """The pre-torch.compile spelling: ``torch._dynamo.optimize("inductor")(fn)``."""
    if ignored:
        _noted("torch._dynamo.optimize(" + ", ".join(sorted(ignored)) + ")", "ignored")
    options = {"guard_filter_fn": guard_filter_fn} if guard_filter_fn is not None else None

    def deco(fn):
        if disable:
            return fn
        return ember.compile(fn, backend=backend, fullgraph=nopython, dynamic=dynamic, options=options)
    return deco


def optimize_assert(backend="inductor", *, dynamic=None, **ignored):
    """``torch._dynamo.optimize_assert(backend)(fn)``: optimize with nopython=True (one graph or an error).
    torch._dynamo.testing.standard_test compiles with it: left as torch's, real dynamo would run there."""
    return optimize(backend, nopython=True, dynamic=dynamic, **ignored)


def cudagraph_mark_step_begin() -> None:
    """No-op: ember's CUDA graph replays need no step marks."""


DYNAMO = {
    "mark_dynamic": mark_dynamic, "maybe_mark_dynamic": maybe_mark_dynamic, "mark_static": mark_static,
    "mark_static_address": mark_static_address, "reset": ember.reset, "explain": explain,
    "disable": disable, "allow_in_graph": ember.allow_in_graph, "substitute_in_graph": ember.substitute_in_graph,
    "graph_break": graph_break, "is_compiling": ember.is_compiling, "optimize": optimize,
    "optimize_assert": optimize_assert,
    "assume_constant_result": assume_constant_result,
}


def compiler_routes() -> dict:
    """``torch.compiler`` name -> ember's (``compile`` itself is set on ``torch``)."""
    return {
        "set_stance": ember.set_stance, "disable": disable, "reset": ember.reset,
        "allow_in_graph": ember.allow_in_graph, "substitute_in_graph": ember.substitute_in_graph,
        "list_backends": ember.list_backends, "cudagraph_mark_step_begin": cudagraph_mark_step_begin,
        "keep_tensor_guards_unsafe": ember.keep_tensor_guards_unsafe,
        "skip_all_guards_unsafe": ember.skip_all_guards_unsafe,
        "skip_guard_on_all_nn_modules_unsafe": ember.skip_guard_on_all_nn_modules_unsafe,
        "skip_guard_on_globals_unsafe": ember.skip_guard_on_globals_unsafe,
        "skip_guard_on_inbuilt_nn_modules_unsafe": ember.skip_guard_on_inbuilt_nn_modules_unsafe,
    }


def wraps_compile(session):
    """``torch.compile`` under ember run: ember.compile with the session's dynamo settings."""
    @functools.wraps(ember.compile)
    def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None,
                disable=False):
        if dynamic is None and session.assume_static_by_default is False:
            dynamic = True
        return ember.compile(model, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                             options=options, disable=disable)
    return compile
