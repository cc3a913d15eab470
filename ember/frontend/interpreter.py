"""The symbolic interpreter: frame state and the dispatch loop. Opcode semantics live in handlers/.

``Tracer`` holds what every level of a trace shares (the output graph, inlining, grad-mode
bookkeeping); ``InstructionTranslator`` runs one code object's bytecode over variable trackers.
A call to a user function is inlined by running a child translator to its RETURN.
"""
from __future__ import annotations

import builtins
import operator
import types

from ember.config import config
from ember.diagnostics import logging as elog
from ember.frontend import bytecode as bc, trace_rules
from ember.frontend.errors import CompileError, InternalError, TracedException, Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import AttrSource, CellSource, DefaultSource, GlobalSource, ItemSource
from ember.frontend.variables.base import CONST_TYPES, ConstantVariable, NullVariable, VariableTracker, is_constant_default
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.exceptions import exception_value
from ember.frontend.variables.functions import NestedFunctionVariable, guarded_by_code
from ember.frontend.variables.iterators import GeneratorVariable
from ember.frontend.variables.lazy import realize, settle_stack
from ember.frontend.variables.objects import SuperVariable
from ember.frontend.variables.sequences import TupleVariable
from ember.frontend.variables.tensor import TensorVariable

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08


class CellVariable(VariableTracker):
    """A cell made inside the trace (a captured local of a traced frame)."""

    EMPTY = object()

    def __init__(self, contents=EMPTY):
        self.contents = contents
        self.owner = None  # (code, name) of the frame variable, when made by MAKE_CELL

    def describe(self):
        return "cell"

    def load(self, tx, name):
        if self.contents is CellVariable.EMPTY:
            raise Unsupported(f"free variable '{name}' referenced before assignment (NameError)")
        return self.contents

    def store(self, tx, name, value):
        self.contents = value


class RealCellVariable(VariableTracker):
    """A closure cell of a real function: read for real, guarded; writes are side effects."""

    def __init__(self, cell, source):
        self.cell = cell
        self.source = source

    def load(self, tx, name):
        written = tx.output.side_effects.load_source(self.source)
        if written is not None:
            return written
        try:
            val = self.cell.cell_contents
        except ValueError:
            raise Unsupported(f"free variable '{name}' referenced before assignment (NameError)") from None
        return VariableTracker.build(tx, val, self.source)

    def store(self, tx, name, value):
        tx.output.side_effects.store_source(self.source, value)


class Tracer:
    """State shared by a whole trace; also the root 'frame' that calls the compiled callable."""

    def __init__(self, output, parent: "Tracer | None" = None):
        self.output = output
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.root = self if parent is None else parent.root
        if parent is None:
            self._mode_restores: list = []
            self.instructions_run = 0
            self.break_at: int | None = None  # frame instruction index where a graph break starts

    # ---- locations ----
    def user_location(self) -> str:
        return ""

    def user_stack(self) -> list[str]:
        out, t = [], self
        while t is not None:
            loc = t.user_location()
            if loc:
                out.append(loc)
            t = t.parent
        return out

    # ---- grad mode / autocast bookkeeping ----
    def push_mode_restore(self, fn, ctx=None) -> None:
        """``fn`` undoes a mode switched for real while tracing; ``ctx`` is the context tracker that
        switched it (a graph break re-enters it after the graph)."""
        self.root._mode_restores.append((fn, ctx))

    def pop_mode_restore(self) -> None:
        self.root._mode_restores.pop()

    def active_contexts(self) -> list:
        return [ctx for _, ctx in self.root._mode_restores]

    def restore_modes(self) -> None:
        while self.root._mode_restores:
            self.root._mode_restores.pop()[0]()

    # ---- calls ----
    def inline_call(self, fn_vt, args: list, kwargs: dict) -> VariableTracker:
        if self.depth >= config.inline_depth_limit:
            raise Unsupported(
                f"inlining depth limit ({config.inline_depth_limit}) reached while calling {fn_vt.describe()}: "
                "deep or unbounded recursion",
                hint="raise ember.config.inline_depth_limit (EMBER_INLINE_DEPTH_LIMIT) or simplify the recursion")

        reason = trace_rules.disabled_reason(getattr(fn_vt, "fn", None))
        if reason is not None:  # e.g. an ember.disable'd method, reached through its class
            raise Unsupported(f"call to {fn_vt.describe()}: {reason}", hint="remove ember.disable from it to trace it")
        code = fn_vt.code
        if code.co_flags & (bc.CO_COROUTINE | bc.CO_ASYNC_GENERATOR | bc.CO_ITERABLE_COROUTINE):
            raise Unsupported(f"calling coroutine or async generator {fn_vt.describe()}")
        real = getattr(fn_vt, "fn", None)
        if isinstance(real, types.FunctionType) and real.__code__ is code:
            self.output.inlined.setdefault(id(real), real)
        symbolic_locals = self._bind(fn_vt, code, args, kwargs)
        cells = self._closure_cells(fn_vt, code)
        child = InstructionTranslator(self.output, code, fn_vt.f_globals, symbolic_locals, cells, parent=self,
                                      fn_vt=fn_vt)
        if code.co_flags & bc.CO_GENERATOR:  # runs one yield at a time, when the consumer pulls

            child.in_generator = True
            return GeneratorVariable(child, fn_vt, args, kwargs)
        return child.run()

    def _closure_cells(self, fn_vt, code) -> dict:
        if not code.co_freevars:
            return {}
        if isinstance(fn_vt, NestedFunctionVariable):
            return dict(zip(code.co_freevars, fn_vt.closure))
        fn = fn_vt.fn
        src = fn_vt.source or self.output.object_source(fn, fn.__qualname__)
        varies = guarded_by_code(fn, fn_vt.source)  # (one the entry holds by name is that object)
        return {name: self._real_cell(fn, src, i, name, varies) for i, name in enumerate(code.co_freevars)}

    def _real_cell(self, fn, fn_source, index: int, name: str, varies: bool) -> "RealCellVariable":
        """The tracker of a closure cell of a real function: one per cell object. Functions that
        share a cell (``inc`` and ``get`` over one ``nonlocal x``) reach it through different paths;
        a write buffered under one path must be what a read through the other sees, so the second
        path reuses the first's tracker, guarded to still be the same cell. A function guarded by
        its code (a nested function) may bring other cells at the next call: its cells are also
        guarded to stay distinct from the other cells the trace treated as distinct."""
        cell = fn.__closure__[index]
        here = ItemSource(AttrSource(fn_source, "__closure__"), index)
        cells = self.output.real_cells
        seen = cells.get(id(cell))
        if seen is not None:
            _, vt, first, _ = seen
            if here != first:
                self.output.guards.add(here, GuardKind.ALIAS, None, other=first)
            return vt
        for _, _, other, other_varies in cells.values():
            if varies or other_varies:
                self.output.guards.add(here, GuardKind.NOT_ALIAS, None, other=other)
        vt = RealCellVariable(cell, CellSource(fn_source, index, name))
        cells[id(cell)] = (cell, vt, here, varies)  # (the cell is kept: its id stays unique)
        return vt

    def _bind(self, fn_vt, code, args, kwargs) -> dict:
        """Bind trackers to parameters the way CPython does (errors become Unsupported)."""
        name = fn_vt.describe()
        nargs, nkw = code.co_argcount, code.co_kwonlyargcount
        varnames = code.co_varnames
        pos_names = varnames[:nargs]
        kwonly = varnames[nargs:nargs + nkw]
        i = nargs + nkw
        varargs = varkw = None
        if code.co_flags & CO_VARARGS:
            varargs = varnames[i]
            i += 1
        if code.co_flags & CO_VARKEYWORDS:
            varkw = varnames[i]
        out: dict = {}
        for pname, v in zip(pos_names, args):
            out[pname] = v
        extra = list(args[nargs:])
        if extra and varargs is None:
            raise Unsupported(f"{name} takes {nargs} positional arguments but {len(args)} were given (TypeError)")
        if varargs is not None:
            out[varargs] = TupleVariable(extra)
        rest = {}
        for k, v in kwargs.items():
            if (k in pos_names[code.co_posonlyargcount:] or k in kwonly):
                if k in out:
                    raise Unsupported(f"{name} got multiple values for argument '{k}' (TypeError)")
                out[k] = v
            elif varkw is not None:
                rest[k] = v
            else:
                raise Unsupported(f"{name} got an unexpected keyword argument '{k}' (TypeError)")
        if varkw is not None:
            out[varkw] = DictVariable(rest)
        missing = [p for p in pos_names if p not in out] + [p for p in kwonly if p not in out]
        if missing:
            if isinstance(fn_vt, NestedFunctionVariable):
                defaults = list(fn_vt.defaults or ())
                kwdefaults = dict(fn_vt.kwdefaults or {})
                for p in missing:
                    if p in kwonly:
                        if p not in kwdefaults:
                            raise Unsupported(f"{name} missing keyword-only argument '{p}' (TypeError)")
                        out[p] = kwdefaults[p]
                    else:
                        di = pos_names.index(p) - (nargs - len(defaults))
                        if di < 0:
                            raise Unsupported(f"{name} missing required argument '{p}' (TypeError)")
                        out[p] = defaults[di]
            else:
                fn = fn_vt.fn
                defaults = fn.__defaults__ or ()
                kwdefaults = fn.__kwdefaults__ or {}
                for p in missing:
                    if p in kwonly:
                        if p not in kwdefaults:
                            raise Unsupported(f"{name} missing keyword-only argument '{p}' (TypeError)")
                        out[p] = self._default(fn_vt, kwdefaults[p], p, p)
                    else:
                        di = pos_names.index(p) - (nargs - len(defaults))
                        if di < 0:
                            raise Unsupported(f"{name} missing required argument '{p}' (TypeError)")
                        out[p] = self._default(fn_vt, defaults[di], di, p)
        return out

    def _default(self, fn_vt, value, key, label):
        # Immutable defaults of a function whose identity is guarded are part of that function.
        if is_constant_default(value):
            return VariableTracker.const(value)
        src = fn_vt.source or self.output.object_source(fn_vt.fn, fn_vt.fn.__qualname__)
        return VariableTracker.build(self, value, DefaultSource(src, key, label))

    # ---- subscripts (shared by handlers and builtins) ----
    def getitem(self, obj, key) -> VariableTracker:
        if isinstance(obj, TensorVariable):
            return self.output.call(self, "call_function", operator.getitem, [obj, key], {})
        if obj.is_constant() and key.is_constant() and not hasattr(obj, "items"):
            try:
                return VariableTracker.const(obj.as_constant()[key.as_constant()])
            except Exception as exc:
                raise Unsupported(f"indexing {obj.describe()} with {key.as_constant()!r} raised {type(exc).__name__}") from None
        if hasattr(obj, "getitem"):
            return obj.getitem(self, key)
        return obj.call_method(self, "__getitem__", [key], {})

    def setitem(self, obj, key, value) -> None:
        if isinstance(obj, TensorVariable):
            self.output.call(self, "call_function", operator.setitem, [obj, key, value], {})
            return
        if hasattr(obj, "setitem"):
            obj.setitem(self, key, value)
            return
        obj.call_method(self, "__setitem__", [key, value], {})

    def make_super(self, args):
        raise Unsupported("super() outside a method")


class InstructionTranslator(Tracer):
    def __init__(self, output, code: types.CodeType, f_globals: dict, symbolic_locals: dict, cells: dict,
                 parent: Tracer | None = None, fn_vt=None):
        super().__init__(output, parent)
        self.code = code
        self.f_globals = f_globals
        self.fn_vt = fn_vt
        self.instructions = bc.decode(code)
        self.locals = symbolic_locals
        self.cells = cells
        self.stack: list[VariableTracker] = []
        self.ip = 0
        self.kw_names: tuple = ()
        self.inst: bc.Instr | None = None
        self.returned: VariableTracker | None = None
        self.in_generator = False  # a generator's frame: YIELD_VALUE suspends it (see GeneratorVariable)
        self.yielded: VariableTracker | None = None
        self.exc_stack: list[VariableTracker] = []  # exceptions being handled (PUSH_EXC_INFO / POP_EXCEPT)
        self.raised_at: dict = {}  # id(exception tracker) -> the instruction that raised it, when caught here
        self.lazy_stack = False  # the stack holds values of a resumed frame not built yet (variables/lazy.py)
        self.scope = None  # a loop segment's frame: the loop whose stops end the trace (loops.py)

    # ---- locations ----
    def user_location(self) -> str:
        line = self.inst.lineno if self.inst is not None else self.code.co_firstlineno
        return f"{self.code.co_filename}:{line} in {self.code.co_name}"

    # ---- stack ----
    def push(self, v: VariableTracker) -> None:
        self.stack.append(v)

    def pop(self) -> VariableTracker:
        return self.stack.pop()

    def popn(self, n: int) -> list:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, inst: bc.Instr) -> None:
        self.ip = inst.target

    # ---- the loop ----
    def run(self) -> VariableTracker:
        from ember.frontend.handlers import HANDLERS  # the handlers build on this module

        trace_bytecode = elog.enabled("bytecode")
        root = self.root
        limit = config.instruction_limit
        instructions = self.instructions
        break_at = root.break_at if self.depth == 1 else None
        scope = self.scope
        first = True  # a segment may start at one of its stops (a while loop's head)
        try:
            while self.returned is None and self.yielded is None:
                if self.ip == break_at:
                    raise BreakHere(self)
                if scope is not None:
                    if not first and scope.stops_trace(self.ip):
                        raise StopHere(self)
                    first = False
                inst = instructions[self.ip]
                if self.lazy_stack:
                    settle_stack(self, inst)
                self.inst = inst
                self.ip += 1
                root.instructions_run += 1
                if root.instructions_run > limit:
                    raise Unsupported(f"trace exceeded {limit} bytecode instructions (an unbounded loop?)",
                                      hint="raise EMBER_INSTRUCTION_LIMIT, or make the loop bound a Python constant")
                if trace_bytecode:
                    elog.artifact("bytecode", f"{'  ' * self.depth}{self.code.co_name} {inst!r}  stack={self.stack}")
                handler = HANDLERS.get(inst.opname)
                if handler is None:
                    raise Unsupported(f"bytecode {inst.opname} is not supported")
                try:
                    handler(self, inst)
                except TracedException as exc:
                    if not self.catch(exc):
                        raise
                except (Unsupported, BreakHere, CompileError):
                    raise
                except Exception as err:
                    # the user's code raising (sorted() of mixed types, a KeyError...) or a gap in
                    # ember: either way the instruction runs as plain Python, where eager's exception
                    # (if any) is raised after everything before it has happened
                    raise Unsupported(f"{inst.opname} raised {type(err).__name__} while tracing: {err}") from err
        except Unsupported as exc:
            if exc.location is None:
                exc.location = self.user_location()
                exc.inner_depth = self.depth
            exc.user_stack.append(self.user_location())
            if self.depth == 1 and exc.frame_index is None and self.inst is not None:
                # where the compiled frame itself stood; inside an except clause, or re-raising what one
                # caught, the instruction that raised: the break runs natively from there, the raise
                # and its handler included
                origin = self.exc_stack[0] if self.exc_stack else getattr(exc, "value", None)
                exc.frame_index = self.raised_at.get(id(origin), self.inst.index)
                exc.frame_code = self.code
            raise
        return self.returned

    def catch(self, exc: TracedException) -> bool:
        """Enter the handler of the ``try`` around the current instruction, as CPython does: cut the
        stack to the handler's depth, push (lasti and) the exception, jump. False: no handler here."""

        entry = bc.exception_handler(self.code, self.inst.offset)
        if entry is None:
            return False
        if self.scope is not None and self.scope.stops_trace(bc.index_at(self.code, entry.target)):
            return False  # a handler around a driven loop: the exception is raised for real, in the driver
        value = exception_value(exc, self)
        self.raised_at.setdefault(id(value), self.inst.index)
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(ConstantVariable(self.inst.offset))
        self.push(value)
        self.ip = bc.index_at(self.code, entry.target)
        return True

    # ---- names ----
    def _global_source(self, name: str) -> GlobalSource:
        g = self.f_globals
        return GlobalSource(name, self.output.globals_ns(g), g.get("__name__", ""))

    def store_global(self, name: str, value: VariableTracker) -> None:
        self.output.side_effects.store_source(self._global_source(name), value)

    def load_global(self, name: str) -> VariableTracker:
        g = self.f_globals
        written = self.output.side_effects.load_source(self._global_source(name)) if self.output.side_effects else None
        if written is not None:
            return written
        if name in g:
            return VariableTracker.build(self, g[name], self._global_source(name))
        b = g.get("__builtins__", builtins)
        bd = b if isinstance(b, dict) else vars(b)
        if name not in bd:
            raise Unsupported(f"name '{name}' is not defined (NameError)")
        val = bd[name]
        if isinstance(val, CONST_TYPES):
            return ConstantVariable(val)
        return VariableTracker.build_object(self, val)

    def make_super(self, args):
        if args:
            return SuperVariable(args[0].as_constant(), args[1])
        if "__class__" not in self.cells or self.code.co_argcount == 0:
            raise Unsupported("super() without arguments outside a method (RuntimeError)")
        cls = self.cells["__class__"].load(self, "__class__").as_constant()
        first = self.code.co_varnames[0]
        obj = realize(self, self.locals.get(first))
        if obj is None and first in self.cells:
            obj = self.cells[first].load(self, first)
        return SuperVariable(cls, obj)


class BreakHere(Exception):
    """Raised when the compiled frame reaches the planned break: the graph so far is complete."""

    def __init__(self, frame: "InstructionTranslator"):
        super().__init__("graph break")
        self.frame = frame


class StopHere(BreakHere):
    """Raised when a loop segment reaches one of its loop's stops: its driver takes over there."""


def is_null(v) -> bool:
    return isinstance(v, NullVariable)


__all__ = ["Tracer", "InstructionTranslator", "CellVariable", "RealCellVariable", "InternalError"]
