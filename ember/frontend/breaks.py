"""Graph breaks, frontend side: turning a trace stopped at a break into an entry that ends by calling
the break function (resume.py builds the bytecode), and starting a trace inside a resume function.

``BreakContext`` belongs to one compiled callable (its FrameCache): the resume functions and callees
compiled on its behalf share its backend and options, and are cached there, so a second call through
the same break reuses every compiled piece.
"""
from __future__ import annotations

import functools
import inspect
import linecache
import threading
import types
import weakref
from dataclasses import dataclass

import torch

from ember.diagnostics import logging as elog
from ember.frontend import loops as L, resume as R, trace_rules
from ember.frontend.errors import Unsupported
from ember.frontend.handlers.blocks import _ContextExit
from ember.frontend.interpreter import CellVariable
from ember.frontend.guards import GuardKind, KeysBut
from ember.frontend.sources import ItemSource, LocalSource
from ember.frontend.variables.base import NullVariable, VariableTracker, guard
from ember.frontend.variables.lazy import LazyVariable, PassThroughVariable
from ember.frontend.variables.contexts import GradModeContextVariable, _restore_grad
from ember.frontend.variables.functions import OpaqueCallableVariable


@dataclass
class BreakRecord:
    """One graph break, for ember.explain and the logs."""

    reason: str
    location: str
    function: str
    kind: str  # "instruction" | "call" (inside a callee, which is compiled on its own) | "loop"

    def __str__(self) -> str:
        return f"{self.location}: {self.reason}"


def _identity(fn) -> tuple:
    """Functions sharing code but not closures (two closures from one factory) need their own
    continuations: those are made with the function's closure cells."""
    return (id(fn.__code__), id(fn.__globals__), tuple(id(c) for c in fn.__closure__ or ()))


class BreakContext:
    def __init__(self, make_cache):
        self._make_cache = make_cache  # fn -> a callable FrameCache with the owner's settings
        self._resumes: dict = {}
        self._break_fns: dict = {}
        self._callees: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._forwards: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # class -> shared forward
        # resume functions and callees are looked up while compiled code runs, from any thread: one
        # FrameCache per target, so that it is compiled once and every thread uses that compile
        self._lock = threading.Lock()

    def resume_for(self, fn: types.FunctionType, scope=None):
        """``target -> continuation(stack, locals)`` for the exits of a break function of ``fn``. In a
        loop's ``scope``: at the loop's stops, hand (stop, stack, locals) back to its driver."""
        def get(target: int):
            if scope is not None and scope.stops_trace(target):
                return L.stopped(target)
            return self.segment(fn, target, scope)
        return get

    def segment(self, fn: types.FunctionType, target: int, scope=None):
        """The compiled continuation of ``fn`` at ``target`` (a loop segment when ``scope`` is set)."""
        key = (_identity(fn), target, scope.key if scope is not None else None)
        hit = self._resumes.get(key)
        if hit is None:
            with self._lock:
                hit = self._resumes.get(key)
                if hit is None:
                    native = R.resume_function(fn, target, scope)
                    # an exception from compiled code inside a try block must reach its handler:
                    # keep such continuations native (the handler then runs as plain Python too).
                    # A loop segment never runs inside a try of its loop (those are its stops), and
                    # its driver's call sits inside the tries around the loop.
                    native_only = scope is None and R.in_try_block(fn.__code__, target)
                    hit = native if native_only else self._make_cache(native)
                    self._resumes[key] = hit
        return hit

    def break_fn(self, fn, start: int, failing: int, nulls: tuple, bound: tuple, scope=None):
        key = (_identity(fn), start, failing, nulls, bound, scope.key if scope is not None else None)
        hit = self._break_fns.get(key)
        if hit is None:
            code = fn.__code__
            region = R.plan_region(code, start, failing, list(nulls), scope)
            kind = "driver" if region.drive is not None else "break"
            name = f"__{kind}_{code.co_name}_at_{R.bc.decode(code)[start].lineno}_{start}"
            drive = region.drive
            bcode = R.build_continuation(
                code, start, stack_nulls=list(nulls), bound=list(bound), region=region,
                resume_for=self.resume_for(fn, scope), name=name, wrap_calls=self.compiled_callee, scope=scope,
                segment_for=(lambda e: self.segment(fn, e, drive)) if drive is not None else None,
                exit_fn=_loop_exit(self.resume_for(fn, scope), scope is None) if drive is not None else None)
            hit = R.make_function(fn, bcode)
            self._break_fns[key] = hit
            if elog.enabled("output_code"):
                elog.artifact("output_code", describe_break(fn, name, region, bound, nulls, scope))
        return hit

    def caches(self) -> list:
        """Every FrameCache compiled on this callable's behalf (resume functions, callees)."""
        from ember.frontend.cache import FrameCache  # cache.py builds on this module

        found = [c for c in self._resumes.values() if isinstance(c, FrameCache)]
        found += [c for c in self._forwards.values() if isinstance(c, FrameCache)]
        return found + [c for c in self._callees.values() if isinstance(c, FrameCache)]

    def shared_forward(self, module):
        """One FrameCache for ``type(module).forward``, called with the module as its first argument,
        which is guarded by its structure, not its identity: every module of the class that this
        callable calls (FSDP2's blocks, through cache.WrapperModuleCache) shares its compiles."""
        cls = type(module)
        hit = self._forwards.get(cls)
        if hit is None:
            with self._lock:
                hit = self._forwards.get(cls)
                if hit is None:
                    fn = cls.forward
                    if not isinstance(fn, types.FunctionType):
                        return None  # nothing to trace: the module runs as plain Python
                    hit = self._make_cache(fn)
                    hit.structural = tuple(inspect.signature(fn).parameters)[:1]
                    self._forwards[cls] = hit
        return hit

    def compiled_callee(self, obj):
        """The callee of a call that broke inside: compiled on its own (functions, methods, modules)."""
        if isinstance(obj, types.MethodType) and isinstance(obj.__func__, types.FunctionType):
            return types.MethodType(self._callee(obj.__func__), obj.__self__)
        if isinstance(obj, (types.FunctionType, torch.nn.Module)):
            return self._callee(obj)
        return obj

    def _callee(self, obj):
        # A module has no code and is no continuation: asking it for __code__ runs nn.Module.__getattr__,
        # which raises (~5 us, three times per call of each FSDP2 block in a loop)
        module = isinstance(obj, torch.nn.Module)
        code = None if module else getattr(obj, "__code__", None)
        if code is not None and code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):  # generators, coroutines
            return obj
        if trace_rules.disabled_reason(obj) or trace_rules.forbidden_message(obj) \
                or (not module and R.resume_info(obj)) or trace_rules.is_allowed_in_graph(obj) \
                or trace_rules.runs_natively(obj):
            return obj  # the user's rules (ember.disable...) and our own continuations stay as they are
        hit = self._callees.get(obj)
        if hit is None:
            with self._lock:
                hit = self._callees.get(obj)
                if hit is None:
                    hit = self._callees[obj] = self._make_cache(obj)
                    if hasattr(hit, "forwards"):  # a wrapper module: its forward is shared here
                        hit.forwards = self
        return hit


class BreakCall(VariableTracker):
    """The entry's return value at a break: ``__break_fn((stack...), {locals...})``."""

    def __init__(self, fn, break_fn, stack: list, locals_: dict, wrap_callee_at: int | None, ctx: BreakContext,
                 contexts: list):
        self.fn = fn
        self.break_fn = break_fn
        self.stack = stack
        self.locals = locals_
        self.wrap_callee_at = wrap_callee_at
        self.ctx = ctx
        self.contexts = contexts  # grad-mode / autocast contexts active at the break, outermost first

    def reconstruct(self, cg) -> str:
        for c in self.contexts:  # the native region runs under the same modes as the traced code
            cg.lines.append(c.reenter_line(cg))
        items = []
        for i, v in enumerate(self.stack):
            if isinstance(v, NullVariable):
                items.append("None")
                continue
            expr = cg.reconstruct(v)
            if i == self.wrap_callee_at:
                expr = f"{cg.const(self.ctx.compiled_callee, 'compile_callee')}({expr})"
            items.append(expr)
        stack = "(" + "".join(f"{e}, " for e in items) + ")"
        local_items = ", ".join(f"{k!r}: {cg.reconstruct(v)}" for k, v in self.locals.items())
        return f"{cg.const(self.break_fn, 'break_fn')}({stack}, {{{local_items}}})"


def frame_function(root) -> types.FunctionType | None:
    """The Python function whose code the compiled frame runs (for globals, closure and code)."""
    info = R.resume_info(root.fn)
    if info is not None:
        return info.fn
    fn = root.fn.__func__ if isinstance(root.fn, types.MethodType) else root.fn
    return fn if isinstance(fn, types.FunctionType) else None


def _frame_state(frame, tracer):
    """The contexts to re-enter, and the locals (and cell contents) a continuation of ``frame`` gets."""
    contexts = tracer.active_contexts()
    if any(c is None or not hasattr(c, "close_for_break") for c in contexts):
        raise R.CannotResume("the break is inside a context ember cannot re-enter")
    for c in reversed(contexts):  # the graph must leave grad mode / autocast as it found them
        c.close_for_break(tracer)
    names = [n for n in frame.code.co_varnames if n in frame.locals and n not in frame.code.co_cellvars]
    cells = {n: c.contents for n, c in frame.cells.items()
             if n in frame.code.co_cellvars and isinstance(c, CellVariable) and c.contents is not CellVariable.EMPTY}
    names += list(cells)
    values = {**{n: frame.locals[n] for n in names if n not in cells}, **cells}
    return contexts, names, values


def break_call(frame, fn, start: int, exc: Unsupported, ctx: BreakContext, tracer, scope=None) -> BreakCall:
    """Plan the break for a trace stopped at ``start`` (the frame's state is the trace's)."""
    if frame.code is not fn.__code__:
        raise R.CannotResume("the stopped frame is not the compiled function's")
    contexts, names, values = _frame_state(frame, tracer)
    nulls = tuple(isinstance(v, NullVariable) for v in frame.stack)
    fn_break = ctx.break_fn(fn, start, exc.frame_index, nulls, tuple(names), scope)
    wrap_at = None
    inst = R.bc.decode(frame.code)[exc.frame_index]
    if (exc.inner_depth > 1 or exc.compile_callee) and inst.opname in ("CALL", "CALL_KW", "CALL_FUNCTION_EX") and start == R.call_start(frame.code, exc.frame_index):
        wrap_at = _callable_position(frame.stack, inst)  # the callee is on the stack: compile it on its own
    return BreakCall(fn, fn_break, list(frame.stack), values, wrap_at, ctx, contexts)


class StopResult(VariableTracker):
    """A loop segment's return value at one of its loop's stops: ``(stop, (stack...), {locals})``."""

    def __init__(self, target: int, stack: list, locals_: dict, contexts: list):
        self.target = target
        self.stack = stack
        self.locals = locals_
        self.contexts = contexts

    def reconstruct(self, cg) -> str:
        for c in self.contexts:  # the driver goes on under the modes the traced code left
            cg.lines.append(c.reenter_line(cg))
        stack = "(" + "".join(f"{cg.reconstruct(v)}, " for v in self.stack) + ")"
        local_items = ", ".join(f"{k!r}: {cg.reconstruct(v)}" for k, v in self.locals.items())
        return f"({self.target}, {stack}, {{{local_items}}})"


def stop_result(frame, tracer) -> StopResult:
    """The end of a loop segment's trace at a stop of its loop (``frame`` is stopped before ``frame.ip``)."""
    if any(isinstance(v, NullVariable) for v in frame.stack):
        raise Unsupported("a pending call at a stop of a loop that runs as Python")
    if len(frame.stack) != R.stack_depths(frame.code)[frame.ip]:
        raise Unsupported(f"the value stack at instruction {frame.ip} differs from the static analysis")
    try:
        contexts, _, values = _frame_state(frame, tracer)
    except R.CannotResume as why:
        raise Unsupported(f"a loop stop inside a block ember cannot re-enter ({why})") from None
    return StopResult(frame.ip, list(frame.stack), values, contexts)


class ReturnUnderModes(VariableTracker):
    """A return with autocast still entered (``torch.autocast(...).__enter__()`` without its exit):
    the graph leaves autocast as it found it (a backend runs it as a whole) and the entry enters it
    again after the graph, as a break does. Grad mode needs none of this: the entry sets the mode
    the traced code left (convert._finish)."""

    def __init__(self, value, contexts: list):
        self.value = value
        self.contexts = contexts

    def reconstruct(self, cg) -> str:
        for c in self.contexts:
            cg.lines.append(c.reenter_line(cg))
        return cg.reconstruct(self.value)


def return_under_modes(result, tracer):
    """``result`` as the entry returns it, with the non-grad contexts still open re-entered after the graph."""
    contexts = [c for c in tracer.active_contexts() if not isinstance(c, GradModeContextVariable)]
    if not contexts:
        return result
    if any(c is None or not hasattr(c, "close_for_break") for c in contexts):
        raise Unsupported("returning inside a context ember cannot re-enter")
    for c in reversed(contexts):
        c.close_for_break(tracer)
    return ReturnUnderModes(result, contexts)


class ScopedReturn(VariableTracker):
    """A loop segment's ``return``: tagged, so that its driver returns it (``(RETURN, (value,), None)``)."""

    def __init__(self, value):
        self.value = value

    def reconstruct(self, cg) -> str:
        return f"({L.RETURN}, ({cg.reconstruct(self.value)},), None)"


def _loop_exit(resume_for, top: bool):
    """A driver's way out of its loops: the function's return value (a driver in a loop's scope
    passes the tagged result on), or the continuation at the stop that left the loop."""
    def exit_loop(r):
        target, stack, locals_ = r
        if target == L.RETURN:
            return stack[0] if top else r
        return resume_for(target)(stack, locals_)
    return exit_loop


def _callable_position(stack: list, inst) -> int | None:
    if inst.opname in ("CALL", "CALL_KW"):
        # [NULL, fn] / [method, self] up to 3.12; [fn, NULL] / [method, self] on 3.13 (CALL_KW: names on top)
        below = len(stack) - inst.arg - 2 - (inst.opname == "CALL_KW")
        if below < 0:
            return None
        return below + 1 if isinstance(stack[below], NullVariable) else below
    pos = len(stack) - 2 - (inst.arg & 1) - (R.bc.PY >= (3, 13))  # 3.13: func, NULL, callargs[, kwargs]
    return pos if pos >= 0 else None


def resume_frame_state(tracer, info: R.ResumeInfo, stack_value: tuple, locals_value: dict):
    """Trackers for the stack and locals a resume function receives. Each is built (and guarded)
    when the trace first uses it (variables/lazy.py); the values a loop's driver owns pass through."""
    locals_src, stack_src = LocalSource(R.LOCALS_ARG), LocalSource(R.STACK_ARG)
    guard(tracer, locals_src, GuardKind.TYPE, dict)
    # which locals are bound, but for those the code stores before reading (a loop body's loop
    # variables: unbound at the first iteration's entry, bound at the later ones; one entry for all)
    dead = R.dead_on_entry(info.code, info.target) if info.scope is not None else ()
    if dead:
        guard(tracer, locals_src, GuardKind.DICT_KEYS, KeysBut(tuple(k for k in locals_value if k not in dead), dead))
    else:
        guard(tracer, locals_src, GuardKind.DICT_KEYS, tuple(locals_value))
    cellnames = set(info.code.co_cellvars)
    varnames = set(info.code.co_varnames) - cellnames - set(dead)  # (a dead one: as if unbound)
    local_vts = {k: LazyVariable(v, ItemSource(locals_src, k)) for k, v in locals_value.items() if k in varnames}
    cell_vts = {k: VariableTracker.build(tracer, v, ItemSource(locals_src, k))
                for k, v in locals_value.items() if k in cellnames}
    floor = info.scope.iterator_floor(info.target) if info.scope is not None else 0
    if info.scope is not None:
        # what the loop changes from one iteration to the next (the item FOR_ITER pushed, the
        # locals the body stores): a module there is one of many alike (``for block in self.h``),
        # guarded by its structure so that one compiled segment serves every block
        written = L.written_in_loop(info.code, info.scope)
        tracer.output.structural_roots = frozenset(
            [ItemSource(stack_src, i) for i in range(floor, len(stack_value))]
            + [ItemSource(locals_src, k) for k in locals_value if k in written and k not in cellnames])
    stack = []
    for i, real in enumerate(stack_value):
        src = ItemSource(stack_src, i)
        if i < floor:
            stack.append(PassThroughVariable(real, src))
        elif _is_context_exit(real):
            stack.append(_reentered_context(tracer, real, VariableTracker.build(tracer, real, src)))
        else:
            stack.append(LazyVariable(real, src))
    return stack, local_vts, cell_vts


def _is_context_exit(real) -> bool:
    return (isinstance(real, functools.partial) and real.func is _restore_grad) or \
        (isinstance(real, types.MethodType) and real.__name__ == "__exit__")


def _reentered_context(tracer, real, vt):
    """A with-block's exit that a break handed over (``_restore_grad``) is a grad-mode context again."""
    if isinstance(real, functools.partial) and real.func is _restore_grad:
        now = torch.is_grad_enabled()
        ctx = GradModeContextVariable(now, entered_at_init=True, prev=real.args[0])
        tracer.push_mode_restore(lambda: torch._C._set_grad_enabled(now), ctx)
        return _ContextExit(ctx)
    if isinstance(real, types.MethodType) and real.__name__ == "__exit__" and \
            type(real.__self__).__module__.split(".")[0] == "torch":
        # leaving one of torch's own contexts (autocast, inference_mode...) switches process state
        # ember does not model: a break (the exit runs as Python), never a traced body
        if not isinstance(real.__self__, torch.autocast):
            # inference_mode and friends also switch grad mode: the continuation stays plain Python
            raise Unsupported(f"resuming inside a {type(real.__self__).__name__} block")

        return OpaqueCallableVariable(real, vt.source)
    return vt


def log_break(record: BreakRecord) -> None:
    elog.artifact("graph_breaks", f"graph break: {record}")


def describe_break(fn, name: str, region, bound, nulls, scope=None) -> str:
    """The break function as readable pseudo-Python: what it restores, which source it runs natively,
    and where each exit resumes (the real thing is bytecode, built by resume.py)."""

    instrs = R.bc.decode(fn.__code__)
    first, last = instrs[region.start].lineno, instrs[region.end].lineno
    src = [linecache.getline(fn.__code__.co_filename, ln).rstrip() for ln in range(first, last + 1)]
    stack = ", ".join("NULL" if n else f"__ember_stack[{i}]" for i, n in enumerate(nulls))
    out = [f"def {name}(__ember_stack, __ember_locals):",
           f"    # ember: graph break in {fn.__qualname__}; bytecode copy of {fn.__code__.co_filename}",
           f"    {', '.join(bound) or '()'} = (__ember_locals[name] for each)  # restored locals",
           f"    # value stack restored: [{stack}]",
           f"    # --- runs natively: lines {first}-{last} (instructions {region.start}-{region.end}) ---"]
    out += [f"    #   {ln}" for ln in src]
    if region.drive is not None:
        heads = ", ".join(str(instrs[h].lineno) for lp in region.drive.loops for h in lp.heads)
        out.append(f"    # --- a driver: only the loop control (lines {heads}) runs natively; where control enters "
                   f"the body it calls a compiled loop segment ({R.LOOP_PREFIX}{fn.__code__.co_name}_at_<line>_<index>),"
                   " which hands back (stop, stack, locals) at the loop's next stop ---")
    for target, depth in sorted(region.exits.items()):
        line = instrs[target].lineno if target < len(instrs) else "?"
        if scope is not None and scope.stops_trace(target):
            out.append(f"    # exit -> return ({target}, <{depth} stack values>, locals())  (back to the loop's driver)")
            continue
        prefix = R.LOOP_PREFIX if scope is not None else "__resume_"
        out.append(f"    # exit -> return {prefix}{fn.__code__.co_name}_at_{line}_{target}"
                   f"(<{depth} stack values>, locals())  (compiled on first call)")
    return "\n".join(out)
