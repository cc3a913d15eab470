"""The VariableTracker protocol, the build table every tracker registers in, plus the two trivial
kinds: constants and the 3.11+ NULL.

``VariableTracker.build(tx, value, source)`` turns a real object reached through ``source`` into a
tracker and records the guard that makes the trace valid for it; ``VariableTracker.const(value)`` does
the same for a value made while tracing (no source, no guard). Neither knows any tracker class: each
tracker module registers builders for its own types beside its classes (``@register_builder``), so
this module imports no tracker and no tracker imports another to build one.
"""
from __future__ import annotations

import enum
import types
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from ember.frontend.dynamic import is_argument_source
from ember.frontend.errors import Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import ItemSource

if TYPE_CHECKING:
    from ember.frontend.interpreter import InstructionTranslator
    from ember.frontend.sources import Source


class _Registry:
    """Names filled in at import time by the modules that define them, read at trace time.

    Trackers refer to each other (a list method returns a bound method, a dict makes a view) and to
    the builtin semantics of ``builtins.py``; importing those modules would tie every tracker module
    to every other. They import this module (plus the module of a class they subclass) and reach a
    sibling's class as ``trackers.Name``
    (every tracker class registers itself) or a shared function as ``helpers.name`` (registered with
    ``@helpers.add`` beside its definition)."""

    def __init__(self, what: str):
        self._what = what

    def add(self, obj, name: "str | None" = None):
        name = name or obj.__name__
        assert self.__dict__.get(name, obj) is obj, f"two {self._what}s named {name}: rename one"
        setattr(self, name, obj)
        return obj

    def __getattr__(self, name: str):
        raise AttributeError(f"no {self._what} named {name!r} is registered: import the module that defines it "
                             "(importing ember.frontend.variables imports every tracker module)")


trackers = _Registry("tracker class")
helpers = _Registry("helper")


@dataclass(frozen=True)
class _Method:
    fn: Callable  # fn(self, tx, args, kwargs) -> tracker
    mutates: bool  # the class's before_mutation runs first (e.g. to record a side effect on an input)


class MethodTable(dict):
    """A tracker class's Python methods: ``name -> handler(self, tx, args, kwargs)``, filled by using
    the table as a decorator in the class body (``@METHODS("append", mutates=True)``). A class's
    ``METHODS`` extends its bases' (``find_method`` walks the MRO), so a subclass lists only what it
    adds or changes."""

    def __call__(self, *names: str, mutates: bool = False):
        def deco(fn):
            for name in names:
                self[name] = _Method(fn, mutates)
            return fn
        return deco


def find_method(cls: type, name: str) -> "_Method | None":
    for klass in cls.__mro__:
        table = klass.__dict__.get("METHODS")
        if table is not None and name in table:
            return table[name]
    return None


class ContainerMethods:
    """What the builtin containers' trackers share (list/tuple: sequences.py, dict: dicts.py):
    ``c.__getitem__(k)`` is the tracker's ``getitem``, and a method no table handles is a graph
    break naming the container's type (the trackers model its methods one by one)."""

    METHODS = MethodTable()

    @METHODS("__getitem__")
    def _getitem(self, tx, args, kwargs):
        return self.getitem(tx, args[0])

    def method_missing(self, tx, name, args, kwargs):
        raise Unsupported(f"{self.py_type.__name__}.{name}()")


class VariableTracker:
    """A symbolic Python value. ``source`` says where the real value lives at run time (None when
    the value was made during tracing)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith("ember.frontend.") and not cls.__name__.startswith("_"):
            trackers.add(cls)

    # -- building trackers (the table lives below the class) --
    @staticmethod
    def build(tx, value, source: "Source") -> "VariableTracker":
        """A tracker for a real value reached through ``source``, guarded (once per source)."""
        cache = tx.output.wrap_cache
        hit = cache.get(source)
        if hit is not None and hit[0] is value:
            return hit[1]
        vt = _build(tx, value, source)
        cache[source] = (value, vt)
        return vt

    @staticmethod
    def const(value) -> "VariableTracker":
        """A tracker for a value made while tracing (e.g. a constant-folded result): no source, no guard."""
        return _build(None, value, None)

    @staticmethod
    def build_object(tx, value, source: "Source | None" = None) -> "VariableTracker":
        """Only the object kinds (callables, classes, modules, user objects), never a constant or
        container: for a value known to be one (a class, a module, a builtin read off a frame)."""
        return _build(tx, value, source, objects_only=True)

    source: "Source | None" = None
    # The attribute holding the real Python object this tracker stands for (an input, a global, a
    # class...), which then decides ``is`` and identity hashing. None: the tracker *is* the object
    # (made in the trace: a new list, user object, tuple, partial...), so identity is the tracker's.
    identity_attr: "str | None" = None

    def python_type(self) -> type:
        raise Unsupported(f"the type of {self.describe()} is not known while tracing")

    def describe(self) -> str:
        return type(self).__name__

    # -- constants --
    def is_constant(self) -> bool:
        return False

    def as_constant(self) -> Any:
        raise Unsupported(f"{self.describe()} is not a Python constant here")

    def as_index(self, tx) -> Any:
        """The value as a sequence index or slice (``lst[i]``): a constant, except for trackers that
        can specialize (a 0-d integer tensor input, under a value guard)."""
        return self.as_constant()

    def is_symbolic(self) -> bool:
        """Holds a symbolic size somewhere (dynamic shapes): its constant value would specialize it."""
        return False

    # -- as an argument of a graph operation --
    def as_node_arg(self) -> Any:
        if self.is_constant():
            return self.as_constant()
        raise Unsupported(f"passing {self.describe()} to a torch operation")

    def as_fake_arg(self) -> Any:
        return self.as_node_arg()

    # -- protocol --
    def getattr(self, tx: "InstructionTranslator", name: str) -> "VariableTracker":
        raise Unsupported(f"reading attribute '{name}' of {self.describe()}")

    def setattr(self, tx: "InstructionTranslator", name: str, value: "VariableTracker") -> None:
        raise Unsupported(f"setting attribute '{name}' of {self.describe()} (side effects are not supported yet)")

    def delattr(self, tx: "InstructionTranslator", name: str) -> None:
        raise Unsupported(f"deleting attribute '{name}' of {self.describe()}")

    def call(self, tx, args: list, kwargs: dict) -> "VariableTracker":
        raise Unsupported(f"calling {self.describe()}")

    def call_method(self, tx, name: str, args: list, kwargs: dict) -> "VariableTracker":
        method = find_method(type(self), name)
        if method is None:
            return self.method_missing(tx, name, args, kwargs)
        if method.mutates:
            self.before_mutation(tx)
        return method.fn(self, tx, args, kwargs)

    def method_missing(self, tx, name: str, args: list, kwargs: dict) -> "VariableTracker":
        """A method no ``METHODS`` table of this class (or its bases) handles."""
        return self.getattr(tx, name).call(tx, args, kwargs)

    def before_mutation(self, tx) -> None:
        """Called before a method registered with ``mutates=True`` changes this object."""

    def unpack(self, tx) -> list:
        raise Unsupported(f"iterating over {self.describe()}")

    def iter(self, tx) -> "VariableTracker":
        return trackers.ListIteratorVariable(list(self.unpack(tx)))

    def length(self, tx) -> int:
        return len(self.unpack(tx))

    def truth(self, tx) -> bool:
        raise Unsupported(f"the truth value of {self.describe()}")

    def reconstruct(self, cg) -> str:
        """A Python expression (in the entry function) that produces this value at run time."""
        if self.source is not None:
            return cg.load(self.source)
        raise Unsupported(f"returning {self.describe()} from a compiled function")

    def __repr__(self) -> str:
        return self.describe()


def identity_of(vt: VariableTracker):
    """What ``is`` compares for ``vt``: the real object it stands for, or the tracker itself for an
    object made in the trace (two fresh objects are never identical, whatever their class)."""
    if vt.identity_attr is None:
        return vt
    obj = getattr(vt, vt.identity_attr, None)
    pin = vt.__dict__.get("identity_pin")
    if pin is not None:  # guarded by what it is, not which object (a nested function): now which object counts
        vt.identity_pin = None
        output, source = pin
        output.guards.add(source, GuardKind.ID, obj)
    if obj is None and not isinstance(vt, ConstantVariable):  # e.g. a ModelOutput made in the trace
        return vt
    return obj


class NullVariable(VariableTracker):
    """The NULL that 3.11+ pushes below a callable."""

    def describe(self) -> str:
        return "NULL"


NULL = NullVariable()

_LITERAL = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), type(NotImplemented))


class ConstantVariable(VariableTracker):
    """An immutable Python value known while tracing (specialised on, guarded when it has a source)."""

    identity_attr = "value"

    def __init__(self, value: Any, source: "Source | None" = None):
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        r = repr(self.value)
        return f"constant {r if len(r) < 50 else r[:47] + '...'}"

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def truth(self, tx) -> bool:
        return bool(self.value)

    def unpack(self, tx) -> list:
        try:
            items = list(self.value)
        except TypeError:
            raise Unsupported(f"iterating over {self.describe()}") from None
        return [ConstantVariable(v) for v in items]

    def length(self, tx) -> int:
        return len(self.value)

    def getattr(self, tx, name: str) -> VariableTracker:
        try:
            attr = getattr(self.value, name)
        except AttributeError:
            raise
        if callable(attr) and not isinstance(attr, type):
            return trackers.ConstantMethodVariable(self.value, name)
        return VariableTracker.const(attr)

    def reconstruct(self, cg) -> str:
        if self.source is not None and not isinstance(self.value, _LITERAL):
            return cg.load(self.source)
        return cg.const(self.value)


# ---------------------------------------------------------------------------------------------------
# The build table. A builder is ``fn(tx, value, source) -> tracker | None``; ``source`` (and ``tx``) is
# None for a value made while tracing, and then the builder records no guard. None from a builder
# means "not mine after all" and the search goes on. The order of the search:
#   1. value kinds by type (tensors, constants, containers), most derived class first;
#   2. RULES, in registration order: what is decided by the value, not its type (the user's
#      ember.disable / allow_in_graph rules, builtins with a handler, polyfills);
#   3. object kinds by type (functions, modules, classes...), most derived class first;
#   4. FALLBACKS, in order (the last one takes anything).

CONST_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), type(NotImplemented),
               torch.dtype, torch.device, torch.layout, torch.memory_format, range, types.CodeType)


def is_constant_default(value) -> bool:
    """A default argument the inliner takes as part of its function (a constant of the trace, not an
    input read at each call): the function's identity guard, or for a nested function the guard on
    its defaults (variables/functions.py), covers it."""
    return isinstance(value, CONST_TYPES) or (type(value) is tuple and all(isinstance(v, CONST_TYPES) for v in value))


def is_namedtuple_cls(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields") and hasattr(cls, "_make")


# what NamedTupleVariable implements natively (tuple's behaviour): a namedtuple class that defines
# any of these itself must run its own code, so it is traced as a user object instead
_TUPLE_PROTOCOL = ("__new__", "__init__", "__getitem__", "__len__", "__iter__", "__reversed__", "__contains__",
                   "__bool__", "__add__", "__radd__", "__mul__", "__rmul__", "__eq__", "__ne__", "__lt__", "__le__",
                   "__gt__", "__ge__", "__hash__", "index", "count")


def is_plain_namedtuple_cls(cls) -> bool:
    """A namedtuple class whose tuple behaviour is tuple's: no protocol method of its own (the
    ``__new__`` that ``collections.namedtuple`` generates is not one)."""
    if not is_namedtuple_cls(cls):
        return False
    for klass in cls.__mro__:
        if klass is tuple:
            return True
        for name in _TUPLE_PROTOCOL:
            fn = klass.__dict__.get(name)
            if fn is None:
                continue
            fn = getattr(fn, "__func__", fn)  # __new__ is stored as a staticmethod
            if name == "__new__" and str(getattr(fn, "__globals__", {}).get("__name__", "")).startswith("namedtuple_"):
                continue
            return False
    return True


@dataclass(frozen=True)
class _Entry:
    fn: Callable
    exact: bool  # only for the type itself, not its subclasses


_VALUE_TYPES: dict[type, _Entry] = {}
_OBJECT_TYPES: dict[type, _Entry] = {}
RULES: list[Callable] = []
FALLBACKS: list[Callable] = []
# type -> (value builders, object builders), from the MRO; weak, so classes made at run time can go
_PLAN: "weakref.WeakKeyDictionary[type, tuple[tuple, tuple]]" = weakref.WeakKeyDictionary()


def register_builder(*types_: type, exact: bool = False, kind: str = "value"):
    """Register ``fn`` as the builder of ``types_`` (and their subclasses unless ``exact``).
    ``kind="object"`` puts it after the value rules (callables, classes, user objects)."""
    table = {"value": _VALUE_TYPES, "object": _OBJECT_TYPES}[kind]

    def deco(fn):
        for t in types_:
            assert t not in table, f"two builders for {t!r}: extend the registered one instead"
            table[t] = _Entry(fn, exact)
        _PLAN.clear()
        return fn
    return deco


def register_rule(fn):
    RULES.append(fn)
    return fn


def register_fallback(fn):
    FALLBACKS.append(fn)
    return fn


def _plan(cls: type) -> tuple[tuple, tuple]:
    plan = _PLAN.get(cls)
    if plan is None:
        plan = _PLAN[cls] = (_builders_along_mro(cls, _VALUE_TYPES), _builders_along_mro(cls, _OBJECT_TYPES))
    return plan


def _builders_along_mro(cls: type, table: dict) -> tuple:
    """The builders ``table`` holds for ``cls`` and its bases, most derived first."""
    found = []
    for klass in cls.__mro__:
        entry = table.get(klass)
        if entry is not None and (klass is cls or not entry.exact):
            found.append(entry.fn)
    return tuple(found)


def _build(tx, value, source, objects_only: bool = False) -> VariableTracker:
    values, objects = _plan(type(value))
    for fns in (() if objects_only else values, RULES, objects, FALLBACKS):
        for fn in fns:
            vt = fn(tx, value, source)
            if vt is not None:
                return vt
    raise AssertionError(f"no builder took {type(value).__name__}: the object fallback is not registered")


def guard(tx, source, kind: GuardKind, expected=None) -> None:
    """Record a guard on ``source`` (nothing for a value made while tracing)."""
    if source is not None:
        tx.output.guards.add(source, kind, expected)


def guard_no_attr(tx, vt, name: str) -> None:
    """The trace went on because ``vt.name`` is missing (getattr with a default, hasattr, ``except
    AttributeError``): guard that it stays missing, so setting it later recompiles."""
    guard(tx, getattr(vt, "source", None), GuardKind.NO_ATTR, name)


def guard_id(tx, value, source) -> None:
    """Guard ``source`` by identity, except for a builtin's bound method (``lst.append``,
    ``dict.fromkeys``): it is made afresh on every attribute read, so an identity guard on it would
    never hold again; its owner's guards pin it down instead."""
    if isinstance(value, (types.BuiltinMethodType, types.MethodWrapperType)):
        owner = getattr(value, "__self__", None)
        if owner is not None and not isinstance(owner, types.ModuleType):
            return
    guard(tx, source, GuardKind.ID, value)


# -- constants: the builders beside ConstantVariable --

def _const_guarded(kind: GuardKind):
    def build(tx, value, source):
        guard(tx, source, kind, value)
        return ConstantVariable(value, source)
    return build


register_builder(type(None), bool)(_const_guarded(GuardKind.CONST))
register_builder(torch.device)(_const_guarded(GuardKind.CONST))
register_builder(torch.dtype, torch.layout, torch.memory_format, type(Ellipsis), enum.Enum)(
    _const_guarded(GuardKind.ID))
register_builder(slice, exact=True)(_const_guarded(GuardKind.CONST))


@register_builder(int, float, str, bytes, complex)
def _build_literal(tx, value, source):
    if source is None:  # made while tracing: a subclass (an IntEnum, a str subclass) is a constant too
        return ConstantVariable(value)
    if type(value) is int and is_argument_source(source) and tx.output.shapes.int_dynamic(source.name(), value):
        vt = tx.output.add_symint_input(value, source)
        if vt is not None:
            return vt
    if type(value) not in (int, float, str, bytes, complex):
        return None  # a user subclass read from the frame: a user object
    guard(tx, source, GuardKind.CONST, value)
    return ConstantVariable(value, source)


@register_builder(type(NotImplemented), range, types.CodeType)
def _build_made_constant(tx, value, source):
    # constants when made while tracing; one read from the frame is a (type-guarded) object
    return ConstantVariable(value) if source is None else None


@register_builder(torch.SymInt, torch.SymFloat, torch.SymBool)
def _build_sym_made(tx, value, source):
    if source is not None:
        return None
    # a symbolic value reached with no graph node for it: specialize (guarded, never wrong)
    return ConstantVariable({torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)](value))


@register_builder(torch.Size)
def _build_size(tx, value, source):
    if source is None:
        if not all(type(v) is int for v in value):
            value = torch.Size(int(v) for v in value)
        return ConstantVariable(value)
    guard(tx, source, GuardKind.TYPE, torch.Size)
    guard(tx, source, GuardKind.LEN, len(value))
    for i, v in enumerate(value):
        guard(tx, ItemSource(source, i), GuardKind.CONST, v)
    return ConstantVariable(value, source)
