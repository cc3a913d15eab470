"""Compile one call: trace the root callable, build the graph, call the backend, generate the entry.

This is the frontend's single entry point for a cache miss (``compile_entry``).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import itertools
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from ember.config import config
from ember.diagnostics import logging as elog
from ember.frontend.codegen import EntryCodegen, build_entry, entry_text, render_signature
from ember.frontend import guard_filter
from ember.frontend.errors import BackendCompilerFailed, Unsupported
from ember.frontend.dynamic import SHAPE_GUARD_GLOBALS, FrameShapeState
from ember.frontend.guards import GLOBAL_STATE_NS, GuardKind, GuardSet, global_state
from ember.frontend import resume, trace_rules
from ember.frontend.breaks import (BreakContext, BreakRecord, ScopedReturn, break_call, frame_function, log_break,
                                   resume_frame_state, return_under_modes, stop_result)
from ember.frontend.interpreter import BreakHere, CellVariable, InstructionTranslator, StopHere, Tracer
from ember.frontend.output_graph import OutputGraph, is_random_target
from ember.frontend.sources import ConstSource, LocalSource
from ember.frontend.variables.base import VariableTracker
from ember.frontend.variables.functions import UserFunctionVariable, UserMethodVariable
from ember.frontend.variables.objects import new_object

_entry_ids = itertools.count()


@dataclass
class RootSpec:
    """What is being compiled: a function, a bound method or an nn.Module's call."""

    kind: str  # "function" | "method" | "module"
    fn: Callable  # the function whose signature the entry mirrors
    self_obj: Any = None
    name: str = ""

    @staticmethod
    def of(obj) -> "RootSpec":
        if isinstance(obj, torch.nn.Module):
            fwd = type(obj).forward if "forward" not in obj.__dict__ else obj.__dict__["forward"]
            return RootSpec("module", fwd, obj, type(obj).__name__)
        if isinstance(obj, types.MethodType):
            first = next(iter(_signature_or_none(obj.__func__) or ()), None)
            if first is None or first.kind not in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD):
                # e.g. a decorator's (*args, **kwargs) wrapper: self travels inside *args
                return RootSpec("function", obj, None, obj.__qualname__)
            return RootSpec("method", obj.__func__, obj.__self__, obj.__qualname__)
        info = resume.resume_info(obj)
        if info is not None:
            line = resume.bc.decode(info.code)[info.target].lineno
            where = f"{info.scope.describe()}, body from line {line}" if info.scope is not None else f"resumed at line {line}"
            return RootSpec("resume", obj, None, f"{info.fn.__qualname__} ({where})")
        return RootSpec("function", obj, None, getattr(obj, "__qualname__", repr(obj)))

    @property
    def signature(self) -> inspect.Signature:
        try:
            return inspect.signature(self.fn, follow_wrapped=False)
        except ValueError:  # a C function without a text signature (torch.sin): take anything
            P = inspect.Parameter
            return inspect.Signature([P("args", P.VAR_POSITIONAL), P("kwargs", P.VAR_KEYWORD)])

    @property
    def skip_first(self) -> bool:
        return self.kind in ("module", "method") and isinstance(self.fn, types.FunctionType)

    def location(self) -> str:
        code = getattr(self.fn, "__code__", None)
        return f"{code.co_filename}:{code.co_firstlineno}" if code else "?"


def _signature_or_none(fn):
    try:
        return inspect.signature(fn, follow_wrapped=False).parameters.values()
    except (TypeError, ValueError):
        return None


@dataclass
class CacheEntry:
    fn: Callable
    guards: GuardSet
    source: str
    namespace: dict
    graph: fx.GraphModule | None
    op_count: int
    compile_seconds: float
    id: int = 0
    params: list = field(default_factory=list)
    build_args: dict = field(default_factory=dict)  # to rebuild the entry with fewer guard checks
    backend: Any = None
    guard_conjuncts: dict = field(default_factory=dict)  # guard line index -> its conditions
    breaks: list = field(default_factory=list)  # BreakRecord of the graph break ending this entry
    # the backend raised: ``fn`` checks the guards only (None when they pass) and nothing runs the graph
    failure: BackendCompilerFailed | None = None
    fallback_warned: bool = False  # suppress_errors: the one warning of this failed graph was given
    # what the persisted frontend cache stores of it (persist.py), set when config.frontend_cache is on
    persist: Any = None


def compile_entry(root: RootSpec, args: tuple, kwargs: dict, backend: Callable,
                  guard_filter_fn: Callable | None = None, ctx: BreakContext | None = None,
                  shapes: FrameShapeState | None = None, structural: tuple = ()) -> CacheEntry:
    """Trace and compile one cache entry. With a break context (fullgraph=False), an unsupported
    instruction of the compiled frame becomes a graph break: the frame is traced again up to the
    break, and the entry ends by calling the break function (see breaks.py / resume.py).
    ``structural``: arguments whose modules are guarded by structure, not identity (a forward that
    identical modules share: OutputGraph.module_by_structure)."""
    with no_full_collections():
        return _compile_entry(root, args, kwargs, backend, guard_filter_fn, ctx, shapes, structural)


_GC_STATE = {"depth": 0, "thresholds": None, "frozen": False}
_GC_LOCK = threading.Lock()
_NO_FULL_COLLECTIONS = 1 << 30  # a third threshold no compile reaches


@contextlib.contextmanager
def no_full_collections():
    """No full collection of Python's cyclic collector (generation 2) during the outermost compile:
    its third threshold is raised until the compile ends, then restored. A compile allocates millions
    of objects (fx nodes, fake tensors, sympy expressions), which triggered full collections, and each
    walks every object of the process (torch, transformers, the model): 4 of them took ~2 s of a
    24-layer Llama training step's cold compile on a loaded 2-core machine. The young generations
    are still collected as usual (garbage cycles die young).

    What survives them (the compile's long-lived garbage: traced graphs, fake tensors) made the
    next full collection come right after the compile, walking the whole process again (~0.4 s,
    issue 29's "full gc" of the cold rows). So the objects that existed before the outermost compile
    are frozen (``gc.freeze``: moved to the permanent generation, which no collection walks) while it
    runs; at its end one full collection walks only what the compile made (about half of a 24-layer
    Llama's process), frees its garbage and resets the collector's count of long-lived objects, then
    the frozen objects are unfrozen (they rejoin the oldest generation as they were). Nothing is
    frozen past the compile, so no garbage of the program escapes collection. Left alone where the
    program disabled the collector; a program that froze objects itself keeps only the raised
    threshold (unfreezing would thaw its objects too). ``compile_entry`` and the frontend cache's
    miss (compile, then the cache store) both open it; nested openings do nothing."""
    with _GC_LOCK:
        outer = _GC_STATE["depth"] == 0
        _GC_STATE["depth"] += 1
        if outer and gc.isenabled():
            t = gc.get_threshold()
            _GC_STATE["thresholds"] = t
            gc.set_threshold(t[0], t[1], _NO_FULL_COLLECTIONS)
            if config.compile_gc_freeze and gc.get_freeze_count() == 0:
                gc.freeze()
                _GC_STATE["frozen"] = True
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_STATE["depth"] -= 1
            t = _GC_STATE["thresholds"]
            if _GC_STATE["depth"] == 0:
                frozen, _GC_STATE["frozen"] = _GC_STATE["frozen"], False
                if frozen:
                    try:
                        if gc.isenabled():
                            gc.collect()  # (the compile's objects only: the rest is frozen)
                    finally:
                        gc.unfreeze()
                if t is not None:
                    _GC_STATE["thresholds"] = None
                    if gc.get_threshold()[2] == _NO_FULL_COLLECTIONS:  # (unless the program set its own meanwhile)
                        gc.set_threshold(*t)


def _compile_entry(root, args, kwargs, backend, guard_filter_fn, ctx, shapes, structural) -> CacheEntry:
    try:
        return _compile(root, args, kwargs, backend, guard_filter_fn, None, shapes, structural)
    except Unsupported as exc:
        fn = frame_function(root) if ctx is not None else None
        if fn is None or exc.frame_index is None or exc.frame_code is not fn.__code__:
            raise
        info = resume.resume_info(root.fn)
        scope = info.scope if info is not None else None  # a loop segment: breaks stay in its loop
        try:
            start = resume.region_start(fn.__code__, exc.frame_index, scope, info.target if info is not None else 0)
            entry = _compile(root, args, kwargs, backend, guard_filter_fn, (start, exc, fn, ctx, scope), shapes,
                             structural)
        except (Unsupported, resume.CannotResume) as why:
            elog.artifact("graph_breaks", f"cannot resume after the break at {exc.location} ({why}); "
                                          f"running {root.name} eagerly")
            raise exc from None
        driven = resume.driven_loops(fn.__code__, exc.frame_index, scope)
        kind = "loop" if driven is None or driven else (
            "call" if exc.inner_depth > 1 or exc.compile_callee else "instruction")
        if kind == "call":  # reported where the compiled frame made the call; the callee gets its own
            inner = exc.location or "?"
            record = BreakRecord(f"a call that breaks inside ({exc.reason}, at {inner}); the callee is compiled "
                                 "on its own", exc.user_stack[-1] if exc.user_stack else inner, root.name, kind)
        elif kind == "loop" and driven:
            record = BreakRecord(f"{exc.reason} (inside a loop: the loop runs as Python, the straight-line code "
                                 "of its body is compiled between the breaks)", exc.location or "?", root.name, kind)
        else:
            record = BreakRecord(exc.reason, exc.location or "?", root.name, kind)
        entry.breaks.append(record)
        log_break(record)
        return entry


def _compile(root: RootSpec, args: tuple, kwargs: dict, backend: Callable, guard_filter_fn, plan,
             shapes: FrameShapeState | None = None, structural: tuple = ()) -> CacheEntry:
    t0 = time.perf_counter()
    start = getattr(backend, "prewarm_trace", None)  # what the backend can start while this frame traces
    if start is not None:
        start()
    info = resume.resume_info(root.fn)
    fn_globals = info.fn.__globals__ if info is not None else getattr(root.fn, "__globals__", {})
    output = OutputGraph(root_globals=fn_globals, shapes=shapes)
    output.structural_roots = frozenset(LocalSource(name) for name in structural)
    with output.scope:  # switches tracing enters (size-oblivious symbols) stay on through the backend
        return _trace(root, output, info, args, kwargs, backend, guard_filter_fn, plan, t0)


def _trace(root: RootSpec, output: OutputGraph, info, args: tuple, kwargs: dict, backend: Callable,
           guard_filter_fn, plan, t0: float) -> CacheEntry:
    tracer = Tracer(output)
    if plan is not None:
        tracer.break_at = plan[0]
    sig = root.signature
    bound_args = (root.self_obj, *args) if root.skip_first else args
    bound = sig.bind(*bound_args, **kwargs)
    bound.apply_defaults()
    params = list(sig.parameters.values())
    call_args, call_kwargs = [], {}
    self_name = params[0].name if root.skip_first else None
    grad_at_start = torch.is_grad_enabled()  # a resumed with-block's exit may switch it for real
    try:
        if info is not None:
            result = _run_resume(tracer, info, bound.arguments)
        else:
            root_vt = _root_callable(tracer, root, self_name)
            for p in params[1:] if root.skip_first else params:
                v = VariableTracker.build(tracer, bound.arguments[p.name], LocalSource(p.name))
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                    call_args.append(v)
                elif p.kind is p.VAR_POSITIONAL:
                    call_args.extend(v.unpack(tracer))
                elif p.kind is p.KEYWORD_ONLY:
                    call_kwargs[p.name] = v
                else:
                    for k, item in v.items.items():
                        call_kwargs[k] = item
            result = root_vt.call(tracer, call_args, call_kwargs)
    except StopHere as stop:  # a loop segment reached a stop of its loop: back to the driver
        result = stop_result(stop.frame, tracer)
    except BreakHere as stop:
        start, exc, fn, ctx, scope = plan
        result = break_call(stop.frame, fn, start, exc, ctx, tracer, scope)
    else:
        if info is not None and info.scope is not None:  # a segment's return: its driver returns it
            result = ScopedReturn(result)
        result = return_under_modes(result, tracer)
    finally:
        # the traced code switched grad mode for real as it went: this is the mode it leaves
        # (to its caller, or to the native code of a break) when the graph has run
        grad_at_end = torch.is_grad_enabled()
        tracer.restore_modes()
        torch._C._set_grad_enabled(grad_at_start)
    local_values = dict(bound.arguments)
    return _finish(root, output, result, backend, t0, self_name, guard_filter_fn, local_values,
                   grad_at_end if grad_at_end != grad_at_start else None)


def _run_resume(tracer, info, arguments) -> Any:
    """Trace a resume function: the original code from ``info.target`` with the restored frame."""
    stack, local_vts, cell_vts = resume_frame_state(tracer, info, arguments[resume.STACK_ARG],
                                                    arguments[resume.LOCALS_ARG])
    fn_vt = UserFunctionVariable(info.fn, tracer.output.object_source(info.fn, info.fn.__qualname__))
    cells = tracer._closure_cells(fn_vt, info.code)
    for name in info.code.co_cellvars:  # the break handed over cell contents, not cells
        cells[name] = CellVariable(cell_vts[name]) if name in cell_vts else CellVariable()
    frame = InstructionTranslator(tracer.output, info.code, info.fn.__globals__, local_vts, cells, parent=tracer,
                                  fn_vt=fn_vt)
    frame.stack = stack
    frame.lazy_stack = True
    frame.scope = info.scope
    frame.ip = info.target
    return frame.run()


def _root_callable(tracer, root: RootSpec, self_name: str | None):
    output = tracer.output
    if root.kind == "module":
        return VariableTracker.build(tracer, root.self_obj, LocalSource(self_name))
    if root.kind == "method":
        self_vt = VariableTracker.build(tracer, root.self_obj, LocalSource(self_name))
        return UserMethodVariable(root.fn, self_vt)
    if isinstance(root.fn, types.FunctionType):
        return UserFunctionVariable(root.fn, output.object_source(root.fn, root.fn.__name__))
    return VariableTracker.build(tracer, root.fn, output.object_source(root.fn, root.name))


def _finish(root, output: OutputGraph, result, backend, t0, self_name, guard_filter_fn, local_values,
            grad_after: bool | None = None) -> CacheEntry:
    entry_id = next(_entry_ids)
    cg = EntryCodegen(output.namespace)
    # 1. the return value (decides the graph outputs), rendered after the call
    cg.lines = body = []
    if grad_after is not None:
        # the graph's _set_grad_enabled nodes switch grad mode for the ops inside it only: a backend
        # runs the graph as a whole (the autograd layer under no_grad, restoring the caller's mode).
        # A mode the traced code leaves switched (``torch.set_grad_enabled(False)`` as a call, a
        # with-block entered before a break and left here) is the entry's to set, after the graph,
        # as the code that follows it (the caller, a break's native code) sees it in eager
        body.append(f"{cg.const(torch._C._set_grad_enabled, 'set_grad_enabled')}({grad_after})")
    return_expr = cg.reconstruct(result)
    body.extend(output.side_effects.codegen(cg))
    graph = output.graph
    gm = None
    call_line = None
    failure = None
    persist_graph = None
    op_count = output.op_nodes()
    if op_count or cg.graph_outputs:
        graph.output(tuple(cg.graph_outputs))
        graph.eliminate_dead_code(is_impure_node=_is_impure)
        gm = fx.GraphModule(_ParamHolder(), graph, class_name=f"EmberGraph{entry_id}")
        if config.verify:
            gm.graph.lint()
        if elog.enabled("graph_code"):  # (the readable code of a 24-layer Llama's graph takes ~0.1 s to render)
            elog.artifact("graph_code", f"graph {entry_id} of {root.name} ({root.location()}):\n"
                          f"{gm.print_readable(print_output=False)}")
        example_inputs = [real for _, real, _ in output.inputs]
        if config.frontend_cache:  # the graph as the backend gets it (a backend may rewrite it in place)
            persist_graph = _persist_graph(gm)
        if output.oblivious_symbols:  # before the backend: it reads the symbols' ranges
            why = output.check_size_one(gm)
            if why is not None:
                elog.artifact("recompiles", f"graph {entry_id} of {root.name} does not hold at size 1 of its "
                              f"dimensions that were 1 before; they keep the guard >= 2 ({why})")
        try:
            compiled = backend(gm, example_inputs)
        except Exception as exc:  # not BaseException: KeyboardInterrupt and SystemExit go through untouched
            failure = backend_failure(backend, exc, root, entry_id, op_count, len(example_inputs))
        else:
            cg.ns["__graph"] = compiled if compiled is not None else gm.forward
    # 2. guards, each after the loads it needs, then the graph inputs. Rendered after the backend ran:
    # a backend that traces the graph may add assumptions about symbolic sizes (the SHAPE guard).
    shape_plan = output.shape_guard()
    if shape_plan is not None:
        output.guards.add(None, GuardKind.SHAPE, shape_plan)
        cg.ns.update(SHAPE_GUARD_GLOBALS)
    if guard_filter_fn is not None:
        def evaluate(src):
            return eval(src.expr(), cg.ns, local_values)  # noqa: S307 - our own source expressions

        output.guards.keep_only(guard_filter.apply(output.guards, guard_filter_fn, evaluate))
    cg.lines = guard_section = []
    cg.reset_temps()  # the body's temps are defined after the call: the guards load their own
    conjuncts = output.guards.check_lines(cg.load, cg.const, guard_section)
    input_exprs = [cg.load(src) for src, _, _ in output.inputs]
    if gm is not None and failure is None:
        call_line = f"__out = __graph({', '.join(input_exprs)})"
    cg.ns["__global_state"] = global_state
    cg.ns.update(GLOBAL_STATE_NS)
    cg.ns["__new_object"] = new_object
    params, names = render_signature(root.signature, cg.ns, skip_first=root.skip_first)
    self_binding = None
    if root.skip_first:
        cg.ns["__root_self"] = root.self_obj
        self_binding = f"{self_name} = __root_self"
    name = f"__ember_entry_{entry_id}"
    header = f"ember: compiled from {root.name} at {root.location()}; {len(output.guards)} guards, {op_count} graph ops"
    before_call = [f"{cg.const(torch.manual_seed, 'manual_seed')}({s})  # np.random.seed({s}) on torch's "
                   "stream, before the graph's draws" for s in output.seeds]
    if failure is not None:  # the guards alone: the cache raises the failure (or runs eagerly) where they pass
        header += f"; backend failed: {failure.headline}"
        body, return_expr, before_call = [], "None", []
    build_args = dict(name=name, header=header, params=params, self_binding=self_binding,
                      guard_lines=guard_section, body_lines=body, call_line=call_line,
                      return_expr=return_expr, ns=cg.ns, before_call=before_call)
    fn, text = build_entry(**build_args)
    elog.artifact("guards", f"entry {entry_id} guards:\n" + "\n".join(guard_section))
    elog.artifact("output_code", text)
    entry = CacheEntry(fn, output.guards, text, cg.ns, gm, op_count, time.perf_counter() - t0, entry_id, names,
                       build_args, backend, conjuncts, failure=failure)
    if config.frontend_cache and failure is None:
        guards_only = dict(build_args, body_lines=[], call_line=None, return_expr="None", before_call=[])
        del guards_only["ns"]
        entry.persist = dict(graph=persist_graph if gm is not None else None, inputs=[s.expr() for s, _, _ in output.inputs],
                             inlined=list(output.inlined.values()), guards=output.guards,
                             guards_source=entry_text(**guards_only))
    return entry


def _persist_graph(gm):
    """The graph as data for the frontend cache, or the reason it cannot be stored."""
    from ember.frontend import persist
    try:
        return persist.graph_data(gm)
    except persist.NotPersistable as e:
        return e


def backend_name(backend) -> str:
    """The name a backend was chosen by (``ember.compile`` tags its compiler), else its function's."""
    name = getattr(backend, "ember_backend_name", None)
    while name is None and isinstance(backend, functools.partial):
        backend = backend.func
        name = getattr(backend, "ember_backend_name", None)
    return name or getattr(backend, "__name__", None) or type(backend).__name__


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def backend_failure(backend, exc: Exception, root: RootSpec, entry_id: int, op_count: int,
                    n_inputs: int) -> BackendCompilerFailed:
    """The error for a backend that raised on graph ``entry_id`` of ``root``, chained to ``exc``. It says
    how to tell a capture fault (the graph ember built) from a backend fault: the reference backends
    run the same graph without compiling it."""
    name = backend_name(backend)
    headline = (f"backend {name!r} failed to compile graph {entry_id} of {root.name} ({root.location()}; "
                f"{_count(op_count, 'graph op')}, {_count(n_inputs, 'input')}): {type(exc).__name__}: {exc}")
    refs = [f'backend="{b}"' for b in ("eager", "aot_eager") if b != name]
    advice = (f"To tell whether ember's capture or the backend is at fault, compile with {' or '.join(refs)} "
              "(they run the captured graph without compiling it; aot_eager adds ember's autograd layer): if "
              f"that matches eager PyTorch, the fault is in backend {name!r}.")
    message = (f"ember: {headline}\n{advice}\nTo run such graphs eagerly instead (one warning each), set "
               "ember.config.suppress_errors = True (EMBER_SUPPRESS_ERRORS=1). The backend's traceback is "
               "chained above.")
    return BackendCompilerFailed(message, backend_name=name, inner_exception=exc, headline=headline, advice=advice)


def _is_impure(node: fx.Node) -> bool:
    if node.op in ("placeholder", "output") or node.meta.get("ember_returns_input"):
        return True
    if node.kwargs.get("out") is not None:  # writes its out tensors, whatever it returns
        return True
    t = node.target
    if isinstance(t, str):
        return t.endswith("_") and not t.endswith("__")
    name = getattr(t, "__name__", "")
    if name in ("setitem", "_set_grad_enabled", "_enter_autocast", "_exit_autocast", "_assert_async"):
        return True
    if is_random_target(t):  # an unused dropout still advances the generator: keep eager's random stream
        return True
    if trace_rules.is_allowed_in_graph(t):  # a user function put in the graph (allow_in_graph) runs at
        return True                          # every call as eager's does, used or not (its effects)
    return name.endswith("_") and not name.endswith("__")


class _ParamHolder(torch.nn.Module):
    """Graphs take every tensor (parameters too) as inputs, so the GraphModule's root holds nothing."""
