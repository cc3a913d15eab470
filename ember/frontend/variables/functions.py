"""Callables: user functions (inlined), torch functions (graph ops), builtins, bound methods."""
from __future__ import annotations

import builtins
import functools
import math
import operator
import types

import torch

from ember.frontend import polyfills, resume, trace_rules
from ember.frontend.errors import CompileError, Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import AttrSource, ItemSource
from ember.frontend.variables.base import (
    CONST_TYPES, ConstantVariable, VariableTracker, guard, guard_id, helpers, is_constant_default, register_builder,
    register_rule, trackers,
)


class CallableVariable(VariableTracker):
    """A function, method or partial: always true (none defines __bool__ or __len__)."""

    def truth(self, tx) -> bool:
        return True


class CallableValueVariable(CallableVariable):
    """An existing callable ``fn``, reached through ``source`` when that is known: ``is`` compares the
    callables, not the trackers (``identity_attr``), since two trackers may stand for one function."""

    identity_attr = "fn"

    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source


class BaseUserFunctionVariable(CallableVariable):
    def call(self, tx, args, kwargs):
        return tx.inline_call(self, args, kwargs)

    def python_type(self):
        return types.FunctionType


class UserFunctionVariable(BaseUserFunctionVariable):
    """A real Python function; calls are inlined into the trace."""

    identity_attr = "fn"

    def __init__(self, fn: types.FunctionType, source=None):
        self.fn = fn
        self.source = source

    @property
    def code(self):
        return self.fn.__code__

    @property
    def f_globals(self):
        return self.fn.__globals__

    def describe(self):
        return f"function {self.fn.__qualname__}"

    def is_constant(self):
        return False

    def getattr(self, tx, name):
        val = getattr(self.fn, name)
        src = AttrSource(self.source, name) if self.source is not None else tx.output.object_source(val, f"{self.fn.__qualname__}.{name}")
        return VariableTracker.build(tx, val, src)

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return cg.const(self.fn, self.fn.__name__)


class NestedFunctionVariable(BaseUserFunctionVariable):
    """A function made by MAKE_FUNCTION inside the trace (lambdas, nested defs, comprehensions)."""

    def __init__(self, code, f_globals, name, qualname, defaults, kwdefaults, closure):
        self.code = code
        self.f_globals = f_globals
        self.name = name
        self.qualname = qualname
        self.defaults = defaults  # tuple of VTs or None
        self.kwdefaults = kwdefaults  # dict str -> VT or None
        self.closure = closure  # tuple of cell variables or None

    def describe(self):
        return f"function {self.qualname}"

    def getattr(self, tx, name):
        attrs = self.__dict__.setdefault("attrs", {})
        if name in attrs:
            return attrs[name]
        if name in ("__name__", "__qualname__"):
            return ConstantVariable(self.name if name == "__name__" else self.qualname)
        if name == "__code__":
            return ConstantVariable(self.code)
        if name == "__module__":
            return ConstantVariable(self.f_globals.get("__name__"))
        if name == "__doc__":
            doc = self.code.co_consts[0] if self.code.co_consts and isinstance(self.code.co_consts[0], str) else None
            return ConstantVariable(doc)
        if name in ("__dict__", "__annotations__"):
            attrs[name] = trackers.DictVariable({})
            return attrs[name]
        if name == "__type_params__":
            return ConstantVariable(())
        if name == "__defaults__":
            return trackers.TupleVariable(list(self.defaults)) if self.defaults else ConstantVariable(None)
        if hasattr(types.FunctionType, name):  # it exists (__globals__, __closure__...): not modelled
            raise Unsupported(f"reading {name} of {self.describe()}, made in the compiled function")
        raise AttributeError(f"'function' object has no attribute '{name}'")

    def setattr(self, tx, name, value):
        self.__dict__.setdefault("attrs", {})[name] = value

    def reconstruct(self, cg):
        # rebuilt as a real function at a graph break. Continuations copy cell contents into new
        # cells, so a closure gets copies too: exact only for variables assigned once
        if self.__dict__.get("attrs"):
            raise Unsupported(f"{self.describe()} with attributes set inside the compiled function crossing a graph break")
        closure = "None"
        if self.closure:
            if self.__dict__.get("_rebuilding"):  # its own closure holds it (a recursive local function)
                raise Unsupported(f"{self.describe()} (a local function whose closure refers to itself) "
                                  "crossing a graph break")
            self._rebuilding = True
            try:
                closure = "(" + "".join(f"{_cell_expr(cg, c, self)}, " for c in self.closure) + ")"
            finally:
                self._rebuilding = False
        defaults = "(" + "".join(f"{cg.reconstruct(d)}, " for d in self.defaults) + ")" if self.defaults else "None"
        fn = (f"{cg.const(types.FunctionType, 'FunctionType')}({cg.const(self.code, 'code')}, "
              f"{cg.const(self.f_globals, 'globals')}, {self.name!r}, {defaults}, {closure})")
        if self.kwdefaults:
            kw = ", ".join(f"{k!r}: {cg.reconstruct(v)}" for k, v in self.kwdefaults.items())
            return cg.memo(self, lambda: f"{cg.const(_with_kwdefaults, 'with_kwdefaults')}({fn}, {{{kw}}})")
        return cg.memo(self, lambda: fn)


def _cell_expr(cg, cell, fn_vt) -> str:
    if isinstance(cell, trackers.RealCellVariable):  # the enclosing function's own cell: share it
        return cg.const(cell.cell, "cell")
    Cell = trackers.CellVariable
    if isinstance(cell, Cell) and cell.owner is not None and cell.contents is not Cell.EMPTY \
            and resume.write_once(*cell.owner):
        return f"{cg.const(types.CellType, 'CellType')}({cg.reconstruct(cell.contents)})"
    raise Unsupported(f"{fn_vt.describe()} (a closure over a variable assigned more than once) crossing a graph break")


def _with_kwdefaults(fn, kwdefaults):
    fn.__kwdefaults__ = kwdefaults
    return fn


class UserMethodVariable(CallableVariable):
    def __init__(self, fn, self_vt: VariableTracker, source=None):
        self.fn = fn
        self.self_vt = self_vt
        self.source = source

    def describe(self):
        return f"method {getattr(self.fn, '__qualname__', self.fn)}"

    def python_type(self):
        return types.MethodType

    def call(self, tx, args, kwargs):
        rule = trace_rules.method_rule(self.fn)
        if rule is not None:
            return rule(tx, self.self_vt, args, kwargs)
        if isinstance(self.fn, types.FunctionType):
            fn_vt = UserFunctionVariable(self.fn, tx.output.object_source(self.fn, self.fn.__qualname__))
            return tx.inline_call(fn_vt, [self.self_vt, *args], kwargs)
        fn_vt = VariableTracker.build(tx, self.fn, tx.output.object_source(self.fn, repr(self.fn)))
        return fn_vt.call(tx, [self.self_vt, *args], kwargs)

    def getattr(self, tx, name):
        if name == "__self__":
            return self.self_vt
        if name == "__func__":
            return UserFunctionVariable(self.fn)
        if name in ("__name__", "__qualname__"):
            return ConstantVariable(getattr(self.fn, name))
        raise Unsupported(f"reading {name} of a bound method")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return f"{cg.const(types.MethodType, 'MethodType')}({cg.const(self.fn, 'fn')}, {cg.reconstruct(self.self_vt)})"


class BoundMethodVariable(CallableVariable):
    """``obj.method`` for a tracker that implements ``call_method(name)`` itself (lists, dicts...)."""

    def __init__(self, obj: VariableTracker, name: str):
        self.obj = obj
        self.name = name

    def describe(self):
        return f"method {self.name} of {self.obj.describe()}"

    def call(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def reconstruct(self, cg):
        return f"{cg.reconstruct(self.obj)}.{self.name}"


class ConstantMethodVariable(CallableVariable):
    """A method of an immutable constant (``"a,b".split``, ``(1).bit_length``)."""

    def __init__(self, value, name):
        self.value = value
        self.name = name

    def describe(self):
        return f"method {type(self.value).__name__}.{self.name}"

    def call(self, tx, args, kwargs):
        if self.name == "__getitem__" and len(args) == 1 and not args[0].is_constant():
            args = [ConstantVariable(args[0].as_index(tx))]  # a constant tuple indexed by a 0-d tensor input
        if not all(a.is_constant() for a in [*args, *kwargs.values()]):
            raise Unsupported(f"{self.describe()} with non-constant arguments")
        res = getattr(self.value, self.name)(*[a.as_constant() for a in args],
                                             **{k: v.as_constant() for k, v in kwargs.items()})
        return VariableTracker.const(res)

    def reconstruct(self, cg):
        return cg.const(getattr(self.value, self.name), self.name)


class BuiltinVariable(CallableValueVariable):
    """A Python builtin (len, isinstance, max...), ``math``/``operator`` functions; see ``builtins.py``."""

    def describe(self):
        return f"builtin {getattr(self.fn, '__name__', self.fn)}"

    def python_type(self):
        return type(self.fn)

    def call(self, tx, args, kwargs):
        return helpers.call_builtin(tx, self.fn, args, kwargs)

    def is_constant(self):
        return True

    def as_constant(self):
        return self.fn

    def reconstruct(self, cg):
        return cg.const(self.fn, getattr(self.fn, "__name__", "builtin"))


class TorchFunctionVariable(CallableValueVariable):
    """A torch function (torch.*, torch.nn.functional.*, Tensor methods used unbound): a graph op."""

    def describe(self):
        return f"torch function {getattr(self.fn, '__qualname__', None) or getattr(self.fn, '__name__', self.fn)}"

    def call(self, tx, args, kwargs):
        return tx.output.call(tx, "call_function", self.fn, args, kwargs)

    def is_constant(self):
        return True

    def as_constant(self):
        return self.fn

    def getattr(self, tx, name):
        return VariableTracker.const(getattr(self.fn, name))

    def reconstruct(self, cg):
        return cg.const(self.fn, getattr(self.fn, "__name__", "torch_fn"))


class ConstantFunctionVariable(CallableVariable):
    """A function whose answer is fixed while compiling (``torch.compiler.is_compiling`` -> True)."""

    identity_attr = "fn"

    def __init__(self, fn, result):
        self.fn = fn
        self.result = result

    def describe(self):
        return f"function {self.fn.__qualname__}"

    def call(self, tx, args, kwargs):
        return ConstantVariable(self.result)


class PartialVariable(CallableVariable):
    def __init__(self, fn: VariableTracker, args: list, kwargs: dict):
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def describe(self):
        return f"functools.partial({self.fn.describe()})"

    def call(self, tx, args, kwargs):
        return self.fn.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})

    def python_type(self):
        return functools.partial

    def getattr(self, tx, name):
        if name == "func":
            return self.fn
        if name == "args":
            return trackers.TupleVariable(list(self.args))
        if name == "keywords":
            return trackers.DictVariable(dict(self.kwargs))
        if name == "__class__":
            return VariableTracker.build(tx, functools.partial, tx.output.object_source(functools.partial, "partial"))
        if name == "__dict__" or any(name in vars(c) for c in functools.partial.__mro__):
            raise Unsupported(f"reading {name} of functools.partial")
        # not an attribute of partial objects (its __dict__ is guarded empty for a real one: NO_ATTR)
        raise AttributeError(f"'functools.partial' object has no attribute '{name}'")

    def reconstruct(self, cg):
        args = "".join(f", {cg.reconstruct(a)}" for a in self.args)
        kw = "".join(f", {k}={cg.reconstruct(v)}" for k, v in self.kwargs.items())
        return f"{cg.const(functools.partial, 'partial')}({cg.reconstruct(self.fn)}{args}{kw})"


class OpaqueCallableVariable(CallableValueVariable):
    """A C function or other callable ember cannot see into."""

    def describe(self):
        name = getattr(self.fn, "__qualname__", None) or getattr(self.fn, "__name__", None) or repr(self.fn)
        mod = getattr(self.fn, "__module__", None)
        return f"{mod + '.' if mod else ''}{name}"

    def call(self, tx, args, kwargs):
        raise Unsupported(f"calling {self.describe()}, a function implemented in C that ember cannot trace into",
                          hint="wrap it with ember.disable, or move it out of the compiled function")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return cg.const(self.fn, getattr(self.fn, "__name__", "fn"))


BUILTIN_FUNCTIONS = {v for k, v in vars(builtins).items() if callable(v) and not isinstance(v, type)}


class OperatorGetterVariable(CallableVariable):
    """operator.itemgetter / attrgetter / methodcaller made in the trace."""

    def __init__(self, kind, args, kwargs):
        self.kind = kind
        self.args = args
        self.kwargs = kwargs

    def describe(self):
        return f"operator.{self.kind.__name__}"

    def call(self, tx, args, kwargs):
        (obj,) = args
        if self.kind is operator.itemgetter:
            vals = [tx.getitem(obj, k) for k in self.args]
        elif self.kind is operator.attrgetter:
            vals = []
            for name in self.args:
                v = obj
                for part in name.as_constant().split("."):
                    v = v.getattr(tx, part)
                vals.append(v)
        else:
            name, *margs = self.args
            return obj.call_method(tx, name.as_constant(), margs, dict(self.kwargs))
        if len(vals) == 1:
            return vals[0]

        return trackers.TupleVariable(vals)



def call_on_constants(fn, args, kwargs):
    """Call ``fn`` now, on the Python values of constant trackers."""
    return fn(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})

class PolyfilledFunctionVariable(CallableVariable):
    """A callable with a Python polyfill (``ember.substitute_in_graph``): calls trace the polyfill,
    or call the original while tracing when folding through constants is allowed."""

    def __init__(self, original, polyfill, can_constant_fold_through: bool, source=None):
        self.original = original
        self.polyfill = polyfill
        self.fold = can_constant_fold_through
        self.source = source

    def describe(self):
        return f"{getattr(self.original, '__qualname__', self.original)!s} (polyfilled)"

    def call(self, tx, args, kwargs):
        values = [*args, *kwargs.values()]
        if self.fold and all(v.is_constant() for v in values):
            return VariableTracker.const(call_on_constants(self.original, args, kwargs))
        src = tx.output.object_source(self.polyfill, f"polyfill of {self.describe()}")
        return UserFunctionVariable(self.polyfill, src).call(tx, args, kwargs)

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return cg.const(self.original, "polyfilled")


class LruCacheVariable(CallableValueVariable):
    """A ``functools.lru_cache`` wrapper. With arguments the trace knows for sure its answer is fixed
    by the cache after the first call (the program sees the cached value whenever it calls), so the
    call runs now and an immutable answer is folded; otherwise the wrapped function is traced,
    ignoring the cache.

    Known for sure: constants, and existing objects hashed by identity, guarded to be the same object.
    The second is what transformers' ``logger.warning_once(msg)`` passes (a ``Logger`` as ``self``):
    folded, the warning prints once, at the first compile (as at the first eager call), where tracing
    into ``logging`` would break the graph on its lock."""

    def describe(self):
        return f"lru_cache wrapper of {getattr(self.fn, '__qualname__', self.fn)}"

    def call(self, tx, args, kwargs):
        known = [_cache_key_value(tx, v) for v in args], {k: _cache_key_value(tx, v) for k, v in kwargs.items()}
        if not any(v is _UNKNOWN for v in [*known[0], *known[1].values()]):
            for v in [*args, *kwargs.values()]:
                if not v.is_constant():  # (an object the cache keys on by identity: it must stay the same)
                    tx.output.guards.add(v.source, GuardKind.ID, v.value)
            result = self.fn(*known[0], **known[1])
            if isinstance(result, CONST_TYPES):
                return ConstantVariable(result)
        wrapped = self.fn.__wrapped__
        src = AttrSource(self.source, "__wrapped__") if self.source is not None else None
        fn_vt = VariableTracker.build(tx, wrapped, src or tx.output.object_source(wrapped, self.describe()))
        return fn_vt.call(tx, args, kwargs)

    def getattr(self, tx, name):
        if self.source is None:
            raise Unsupported(f"reading {name} of {self.describe()}")
        return VariableTracker.build(tx, getattr(self.fn, name), AttrSource(self.source, name))

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return cg.const(self.fn, "lru_cache_wrapper")


_UNKNOWN = object()


def _cache_key_value(tx, v):
    """The value an ``lru_cache`` would key on for tracker ``v`` when the trace knows it for sure, else
    ``_UNKNOWN``: a constant, or an existing object with a source whose class hashes and compares by
    identity and that this trace has not written to."""

    if v.is_constant():
        value = v.as_constant()
        return value if isinstance(value, CONST_TYPES) else _UNKNOWN
    if type(v) is trackers.UserObjectVariable and v.source is not None \
            and not tx.output.side_effects.written_attrs(v.value):
        cls = type(v.value)
        if cls.__hash__ is object.__hash__ and cls.__eq__ is object.__eq__:
            return v.value
    return _UNKNOWN


class DisabledFunctionVariable(OpaqueCallableVariable):
    """A callable marked with ``ember.disable``: never traced."""

    def __init__(self, fn, reason: str, source=None):
        super().__init__(fn, source)
        self.reason = reason

    def call(self, tx, args, kwargs):
        raise Unsupported(f"call to {self.describe()}: {self.reason}",
                          hint="remove ember.disable from it to trace it")


class ForbiddenCallableVariable(OpaqueCallableVariable):
    """A callable that must not run inside compiled code (``set_stance``): an error, not a fallback."""

    def __init__(self, fn, message: str, source=None):
        super().__init__(fn, source)
        self.message = message

    def call(self, tx, args, kwargs):
        raise CompileError(f"{self.message} (at {tx.user_location()}); call it outside the compiled function")


# -- builders: callables --------------------------------------------------------------------------
# builtin -> its handler (len, isinstance, max...): filled by ``builtins.py``'s ``@handler``; a value
# found here is traced by that handler, whatever its type.
BUILTIN_HANDLERS: dict = {}


def handler(*fns):
    """Register the decorated ``f(tx, fn, args, kwargs)`` as the handler of the builtins ``fns``."""
    def deco(f):
        for fn in fns:
            BUILTIN_HANDLERS[fn] = f
        return f

    return deco


@register_rule
def _build_by_rule(tx, value, source):
    """What is decided by the value itself: the user's rules (ember/control.py), Python behind a
    C function, builtins with a handler, and trace_rules' special callables, in that order."""
    vt = _user_rule(value, source)
    if vt is None:
        python_fn = trace_rules.python_behind(value)
        if python_fn is not None:
            guard_id(tx, value, source)
            return UserFunctionVariable(python_fn)
        equivalent = polyfills.python_equivalent(value)
        if equivalent is not None:  # a C function with a Python equivalent ember ships
            guard_id(tx, value, source)
            fn, bound = equivalent
            fn_vt = UserFunctionVariable(fn, tx.output.object_source(fn, f"Python equivalent of {fn.__name__}"))
            return PartialVariable(fn_vt, [VariableTracker.build_object(tx, b) for b in bound], {}) if bound else fn_vt
        if _in(value, polyfills.FOLD_ON_CONSTANTS):
            guard_id(tx, value, source)
            return PolyfilledFunctionVariable(value, value, True, source)
        try:
            if value in BUILTIN_HANDLERS:
                vt = BuiltinVariable(value, source)
            elif (special := trace_rules.special_callable(value)) is not None:
                vt = special(value, source)
        except TypeError:  # unhashable
            return None
    if vt is not None:
        guard_id(tx, value, source)
    return vt


@register_rule
def _build_ember_compiled(tx, value, source):
    """A function compiled with ember.compile, called by the traced code: traced as the function it
    compiles (its own compile options do not apply inside another compile, as torch.compile ignores
    an inner torch.compile), not through ember's own cache and backend code: tracing that ran the
    inner backend's Python and guarded on its effects (a fresh entry rejected its own inputs), or
    stopped at the wrapper's __dict__."""
    cls = type(value)
    if cls.__name__ != "EmberFunction" or cls.__module__ != "ember.api":
        return None
    guard_id(tx, value, source)
    orig = value.__dict__["_orig_fn"]
    return VariableTracker.build(tx, orig, AttrSource(source, "_orig_fn") if source is not None else None)


def _in(value, table) -> bool:
    try:
        return value in table
    except TypeError:  # unhashable
        return False


def _user_rule(value, source):
    """The tracker the user's own rules (ember/control.py) ask for, or None."""
    msg = trace_rules.forbidden_message(value)
    if msg is not None:
        return ForbiddenCallableVariable(value, msg, source)
    reason = trace_rules.disabled_reason(value)
    if reason is not None:
        return DisabledFunctionVariable(value, reason, source)
    poly = trace_rules.polyfill_of(value)
    if poly is not None:
        return PolyfilledFunctionVariable(value, poly[0], poly[1], source)
    if trace_rules.is_allowed_in_graph(value):
        return TorchFunctionVariable(value, source)
    return None


@register_builder(torch._ops.OpOverload, torch._ops.OpOverloadPacket, kind="object")
def _build_op(tx, value, source):
    guard_id(tx, value, source)  # an operator called directly (torch.ops.aten.add.Tensor): a graph op
    return TorchFunctionVariable(value, source)


@register_builder(types.FunctionType, kind="object")
def _build_function(tx, value, source):
    if trace_rules.is_torch_callable(value):
        guard_id(tx, value, source)
        return TorchFunctionVariable(value, source)
    vt = UserFunctionVariable(value, source)
    if _guard_nested_by_code(tx, value, source):
        # (``is``, a dict key or a set member compares which object it is: identity_of adds the
        # identity guard then, else a later call's same-code function would take the baked answer)
        vt.identity_pin = (tx.output, source)
    else:
        guard_id(tx, value, source)
    return vt


_CO_NESTED = 0x10  # (inspect.CO_NESTED: a def or lambda inside another function)


def _guard_nested_by_code(tx, fn, source) -> bool:
    """Guard a nested function (a ``def`` or ``lambda`` run inside its maker: a new object at every
    call of the maker) by what its calls depend on instead of its identity: its code, its globals and
    its defaults; the closure cells it reads are guarded where the trace reads them (``CellSource``),
    as any value. An identity guard never held again for a function made in the frame a graph break
    resumes: the resumed frame recompiled at every call until its recompile limit, then ran eagerly
    (PyTorch's test_no_recompile_inner_function; torch.compile guards such functions by their code
    too). Only plain functions: one with attributes (``ember.disable``'s mark, ``__wrapped__``) keeps
    the identity guard."""
    if not guarded_by_code(fn, source):
        return False
    guard(tx, source, GuardKind.TYPE, types.FunctionType)
    guard(tx, AttrSource(source, "__code__"), GuardKind.ID, fn.__code__)
    guard(tx, AttrSource(source, "__globals__"), GuardKind.ID, fn.__globals__)
    _guard_defaults(tx, AttrSource(source, "__defaults__"), fn.__defaults__)
    _guard_defaults(tx, AttrSource(source, "__kwdefaults__"), fn.__kwdefaults__)
    return True


def _guard_defaults(tx, source, values) -> None:
    """The defaults the inliner takes as constants of the function (``is_constant_default``:
    interpreter._default) are guarded here, by type and value; any other (a tensor, a list) is read
    through its ``DefaultSource`` where a call uses it, and guarded there as any input is."""
    items = values.items() if isinstance(values, dict) else enumerate(values or ())
    if all(is_constant_default(v) for _, v in items):
        guard(tx, source, GuardKind.CONST, values)
        return
    guard(tx, source, GuardKind.TYPE, type(values))
    if isinstance(values, dict):
        guard(tx, source, GuardKind.DICT_KEYS, tuple(values))
    else:
        guard(tx, source, GuardKind.LEN, len(values))
    for k, v in (values.items() if isinstance(values, dict) else enumerate(values)):
        if is_constant_default(v):
            guard(tx, ItemSource(source, k), GuardKind.CONST, v)


def guarded_by_code(fn, source) -> bool:
    """Is ``fn``, found at ``source``, guarded by its code rather than its identity (so its closure
    cells may be other cell objects at the next call)? A plain nested function without attributes."""
    return not (source is None or type(fn) is not types.FunctionType or not fn.__code__.co_flags & _CO_NESTED
                or fn.__dict__)


@register_builder(types.MethodType, kind="object")
def _build_method(tx, value, source):
    func = value.__func__
    if source is not None:
        guard(tx, AttrSource(source, "__func__"), GuardKind.ID, func)
        self_vt = VariableTracker.build(tx, value.__self__, AttrSource(source, "__self__"))
    else:
        self_vt = VariableTracker.const(value.__self__)
    if trace_rules.is_torch_callable(func):
        return TorchFunctionVariable(value, source)
    return UserMethodVariable(func, self_vt)


@register_builder(types.BuiltinFunctionType, types.MethodWrapperType,  # (BuiltinMethodType is the same type)
                  types.WrapperDescriptorType, types.MethodDescriptorType, types.ClassMethodDescriptorType,
                  kind="object")
def _build_builtin_callable(tx, value, source):
    guard_id(tx, value, source)
    if trace_rules.is_torch_callable(value):
        return TorchFunctionVariable(value, source)
    self_obj = getattr(value, "__self__", None)
    if self_obj is not None and not isinstance(self_obj, types.ModuleType):
        if isinstance(self_obj, CONST_TYPES) or isinstance(self_obj, (tuple, frozenset)):
            return ConstantMethodVariable(self_obj, value.__name__)
    name = getattr(value, "__name__", "")
    if getattr(builtins, name, None) is value or getattr(math, name, None) is value \
            or getattr(operator, name, None) is value:
        return BuiltinVariable(value, source)
    return OpaqueCallableVariable(value, source)


@register_builder(functools._lru_cache_wrapper, kind="object")
def _build_lru_cache(tx, value, source):
    guard_id(tx, value, source)
    return LruCacheVariable(value, source)


@register_builder(functools.partial, kind="object")
def _build_partial(tx, value, source):
    guard(tx, source, GuardKind.TYPE, functools.partial)
    if source is not None:
        fn = VariableTracker.build(tx, value.func, AttrSource(source, "func"))
        args_src = AttrSource(source, "args")
        args = [VariableTracker.build(tx, a, ItemSource(args_src, i)) for i, a in enumerate(value.args)]
        kw_src = AttrSource(source, "keywords")
        kw = {k: VariableTracker.build(tx, v, ItemSource(kw_src, k)) for k, v in value.keywords.items()}
    else:
        fn = VariableTracker.const(value.func)
        args = [VariableTracker.const(a) for a in value.args]
        kw = {k: VariableTracker.const(v) for k, v in value.keywords.items()}
    vt = PartialVariable(fn, args, kw)
    vt.source = source  # what a missing-attribute guard reads
    return vt


@register_builder(staticmethod, classmethod, kind="object")
def _build_descriptor(tx, value, source):
    return VariableTracker.build_object(tx, value.__func__, source)
