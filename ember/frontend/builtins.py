"""Python builtins and operators on variable trackers: one handler per builtin, in a table.

Rules: constants fold (the real builtin runs on the real values); anything touching a tensor becomes
a graph op or is refused when it needs tensor data; containers are handled item by item.
"""
from __future__ import annotations

import abc
import builtins
import collections
import dataclasses
import functools
import inspect
import math
import operator
from typing import Callable

import torch

from ember.frontend.errors import TracedException, Unsupported
from ember.frontend.variables import functions as F, symbolic
from ember.frontend.variables.base import ConstantVariable, VariableTracker, guard_no_attr, helpers, identity_of
from ember.frontend.variables.deques import DequeVariable
from ember.frontend.variables.dict_views import DictViewVariable, view_operator
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.functions import (
    BUILTIN_HANDLERS, OperatorGetterVariable, PartialVariable, UserMethodVariable, handler,
)
from ember.frontend.variables.iterators import (
    EnumerateIteratorVariable, FilterIteratorVariable, IteratorVariable, ListIteratorVariable, MapIteratorVariable,
    ZipIteratorVariable, iterate, make_itertool,
)
from ember.frontend.variables.model_outputs import ModelOutputVariable
from ember.frontend.variables.objects import NewObjectVariable, OpaqueObjectVariable, UserObjectVariable, lookup_static
from ember.frontend.variables.sequences import (
    BaseSequenceVariable, ListVariable, SizeVariable, SliceVariable, TupleVariable,
)
from ember.frontend.variables.sets import SetVariable
from ember.frontend.variables.symbolic import SymIntVariable
from ember.frontend.variables.tensor import TensorMethodVariable, TensorVariable

BINARY = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
    "%": operator.mod, "**": operator.pow, "@": operator.matmul, "&": operator.and_, "|": operator.or_,
    "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift,
}
INPLACE = {
    "+": operator.iadd, "-": operator.isub, "*": operator.imul, "/": operator.itruediv, "//": operator.ifloordiv,
    "%": operator.imod, "**": operator.ipow, "@": operator.imatmul, "&": operator.iand, "|": operator.ior,
    "^": operator.ixor, "<<": operator.ilshift, ">>": operator.irshift,
}
COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, ">=": operator.ge}
DUNDER = {
    operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"), operator.mul: ("__mul__", "__rmul__"),
    operator.truediv: ("__truediv__", "__rtruediv__"), operator.floordiv: ("__floordiv__", "__rfloordiv__"),
    operator.mod: ("__mod__", "__rmod__"), operator.pow: ("__pow__", "__rpow__"), operator.matmul: ("__matmul__", "__rmatmul__"),
    operator.and_: ("__and__", "__rand__"), operator.or_: ("__or__", "__ror__"), operator.xor: ("__xor__", "__rxor__"),
    operator.lshift: ("__lshift__", "__rlshift__"), operator.rshift: ("__rshift__", "__rrshift__"),
    operator.eq: ("__eq__", "__eq__"), operator.ne: ("__ne__", "__ne__"), operator.lt: ("__lt__", "__gt__"),
    operator.le: ("__le__", "__ge__"), operator.gt: ("__gt__", "__lt__"), operator.ge: ("__ge__", "__le__"),
}
_INPLACE_TO_BINARY = {v: BINARY[k] for k, v in INPLACE.items()}


def _fold(fn, *vals, **kw):
    try:
        return VariableTracker.const(fn(*vals, **kw))
    except Exception as exc:
        raise Unsupported(f"{getattr(fn, '__name__', fn)}{vals} raised {type(exc).__name__}: {exc} while tracing") from None


def _is_seq(v):
    return isinstance(v, BaseSequenceVariable) or (v.is_constant() and type(v.as_constant()) in (tuple, list, torch.Size))


def _as_seq(tx, v) -> list:
    return v.unpack(tx)


@helpers.add
def apply_operator(tx, fn: Callable, a: VariableTracker, b: VariableTracker) -> VariableTracker:
    """``fn(a, b)`` for a binary operator function (operator.add, operator.iadd, operator.lt, ...)."""
    if (r := helpers.numpy_operator(tx, fn, a, b)) is not None:  # an ndarray on either side
        return r
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        if fn in _INPLACE_TO_BINARY and not isinstance(a, TensorVariable):
            fn = _INPLACE_TO_BINARY[fn]  # `n += t` with a Python number n rebinds: n = n + t
        return tx.output.call(tx, "call_function", fn, [a, b], {})
    if isinstance(a, SymIntVariable) or isinstance(b, SymIntVariable):
        return symbolic.binary(tx, fn, a, b)
    if a.is_constant() and b.is_constant() and not isinstance(a, (ListVariable, SetVariable)):
        return _fold(fn, a.as_constant(), b.as_constant())
    base = _INPLACE_TO_BINARY.get(fn, fn)
    if isinstance(a, DictViewVariable) or isinstance(b, DictViewVariable):
        r = view_operator(tx, base, a, b)
        if r is not None:
            return r
    # sequences
    if base is operator.add and _is_seq(a) and _is_seq(b):
        if fn is operator.iadd and isinstance(a, ListVariable):
            a.call_method(tx, "extend", [b], {})
            return a
        items = _as_seq(tx, a) + _as_seq(tx, b)
        return ListVariable(items) if isinstance(a, ListVariable) else (
            SizeVariable(items) if isinstance(a, SizeVariable) else TupleVariable(items))
    if base is operator.mul and (_is_seq(a) and b.is_constant() or _is_seq(b) and a.is_constant()):
        seq, n = (a, b) if _is_seq(a) else (b, a)
        items = _as_seq(tx, seq) * n.as_constant()
        if fn is operator.imul and isinstance(a, ListVariable):
            a.items[:] = items
            return a
        return ListVariable(items) if isinstance(seq, ListVariable) else TupleVariable(items)
    if base in (operator.eq, operator.ne) and (_is_seq(a) or isinstance(a, DictVariable)):
        eq = sequences_equal(tx, a, b)
        return ConstantVariable(eq if base is operator.eq else not eq)
    if base in (operator.lt, operator.le, operator.gt, operator.ge) and _is_seq(a) and _is_seq(b):
        return _fold(base, tuple(x.as_constant() for x in _as_seq(tx, a)), tuple(x.as_constant() for x in _as_seq(tx, b)))
    if base is operator.or_ and isinstance(a, DictVariable) and isinstance(b, DictVariable):
        if fn is operator.ior:
            a.call_method(tx, "update", [b], {})
            return a
        # dict.__or__ copies into a plain dict; collections' dicts keep their type
        py_type = a.py_type if a.py_type is dict or a.py_type.__module__ == "collections" else dict
        merged = DictVariable(a.items, py_type=py_type, key_vts=a.key_vts,
                              default_factory=a.default_factory if py_type is not dict else None)
        merged.items.update(b.items)
        return merged
    if isinstance(a, SetVariable) or isinstance(b, SetVariable):
        return VariableTracker.const(base(a.as_constant(), b.as_constant()))
    if base in (operator.eq, operator.ne):
        r = _user_dunder(tx, base, a, b)
        if r is not None:
            return r
        if base is operator.ne:  # object.__ne__ inverts a user's __eq__
            r = _user_dunder(tx, operator.eq, a, b)
            if r is not None:
                return ConstantVariable(not r.truth(tx))
        if isinstance(a, UserMethodVariable) and isinstance(b, UserMethodVariable):  # bound methods
            same = a.fn is b.fn and identical(a.self_vt, b.self_vt)
            return ConstantVariable(same if base is operator.eq else not same)
        same = identical(a, b)
        return ConstantVariable(same if base is operator.eq else not same)
    r = _user_dunder(tx, base, a, b)
    if r is not None:
        return r
    raise Unsupported(f"operator {getattr(fn, '__name__', fn)} on {a.describe()} and {b.describe()}")


def _user_dunder(tx, fn, a, b):
    names = DUNDER.get(fn)
    if names is None:
        return None
    for obj, other, name in ((a, b, names[0]), (b, a, names[1])):
        if isinstance(obj, (NewObjectVariable, UserObjectVariable)):
            static, _ = lookup_static(obj.python_type(), name)
            if static is not None and static is not getattr(object, name, None):
                r = obj.call_method(tx, name, [other], {})
                if not (r.is_constant() and r.as_constant() is NotImplemented):
                    return r
    return None


@helpers.add
def identical(a: VariableTracker, b: VariableTracker) -> bool:
    """``a is b``: the same real object, or (objects made in the trace) the same tracker."""
    if a is b:
        return True
    if a.is_constant() and b.is_constant():
        try:
            return a.as_constant() is b.as_constant() or (type(a.as_constant()) is type(b.as_constant()) and a.as_constant() == b.as_constant() and isinstance(a.as_constant(), (type(None), bool)))
        except Exception:
            return False
    if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
        return a.node is b.node
    ka, kb = identity_of(a), identity_of(b)
    if ka is a or kb is b:  # at least one was made in the trace: only itself is itself
        return False
    return ka is kb


def is_op(tx, a, b) -> bool:
    if isinstance(a, SymIntVariable) or isinstance(b, SymIntVariable):
        # `n is None` must not specialize n: an int is only ever itself
        return a is b or (isinstance(a, SymIntVariable) and isinstance(b, SymIntVariable) and a.node is b.node)
    if a.is_constant() and b.is_constant() and not isinstance(a, (BaseSequenceVariable, SetVariable)) \
            and not isinstance(b, (BaseSequenceVariable, SetVariable)):
        return a.as_constant() is b.as_constant()
    if a.is_constant() and a.as_constant() is None or b.is_constant() and b.as_constant() is None:
        return False if type(a) is not type(b) else identical(a, b)
    return identical(a, b)


@helpers.add
def values_equal(tx, a, b) -> bool:
    """``a == b`` as containers compare items (``in``, list ==, index, count, remove): identity first."""
    if identical(a, b):
        return True
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        if isinstance(a, TensorVariable) and isinstance(b, TensorVariable) and a.node is b.node:
            return True
        if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
            raise Unsupported("comparing two tensors with == in Python needs their data")
        return False
    return apply_operator(tx, operator.eq, a, b).truth(tx)


def sequences_equal(tx, a, b) -> bool:
    if isinstance(a, DictVariable):
        if not isinstance(b, DictVariable) or list(a.items) != list(b.items) and set(a.items) != set(b.items):
            return False
        return all(values_equal(tx, a.items[k], b.items[k]) for k in a.items)
    if not _is_seq(b):
        return False
    ta = list if isinstance(a, ListVariable) else tuple
    tb = list if isinstance(b, ListVariable) else tuple
    if a.is_constant() and type(a.as_constant()) is list:
        ta = list
    if b.is_constant() and type(b.as_constant()) is list:
        tb = list
    if ta is not tb:
        return False
    xs, ys = _as_seq(tx, a), _as_seq(tx, b)
    return len(xs) == len(ys) and all(values_equal(tx, x, y) for x, y in zip(xs, ys))


@helpers.add
def contains(tx, container, item) -> VariableTracker:
    if isinstance(container, TensorVariable):
        raise Unsupported("'x in tensor' needs the tensor's data")
    if container.is_constant() and item.is_constant() and not isinstance(container, BaseSequenceVariable):
        return _fold(operator.contains, container.as_constant(), item.as_constant())
    if isinstance(container, IteratorVariable):  # consumes up to the first match, no further
        return ConstantVariable(any(values_equal(tx, x, item) for x in iterate(tx, container)))
    if isinstance(container, (DictVariable, SetVariable)) or hasattr(container, "call_method") and \
            not isinstance(container, BaseSequenceVariable):
        return container.call_method(tx, "__contains__", [item], {})
    return ConstantVariable(any(values_equal(tx, x, item) for x in container.unpack(tx)))


@helpers.add
def sort_items(tx, items, key, reverse) -> list:
    keyed = []
    for it in items:
        k = key.call(tx, [it], {}) if key is not None and not (key.is_constant() and key.as_constant() is None) else it
        keyed.append((k.as_constant(), it))
    keyed.sort(key=lambda p: p[0], reverse=bool(reverse))
    return [it for _, it in keyed]


@helpers.add
def dict_items_of(tx, v):
    """(key, value) trackers of a mapping or an iterable of pairs; pairs are pulled one at a time."""
    if isinstance(v, DictVariable):
        yield from [(v.key_vt(k), val) for k, val in v.items.items()]
        return

    if isinstance(v, ModelOutputVariable):
        yield from [(ConstantVariable(k), val) for k, val in v.values.items()]
        return
    if isinstance(v, (UserObjectVariable, NewObjectVariable)):
        # a mapping that is not a dict (a collections.abc.Mapping subclass, anything with keys()):
        # CPython reads keys() and obj[key], never iterates pairs; iterating its keys as pairs
        # unpacked each 2-character key into a (key, value) pair
        keys = lookup_attr(tx, v, "keys")
        if keys is not _MISSING:
            for k in iterate(tx, keys.call(tx, [], {})):
                yield k, tx.getitem(v, k)
            return
    for pair in iterate(tx, v):
        k, val = pair.unpack(tx)
        yield k, val


# ---- constructors of builtin types ---------------------------------------------------------
@helpers.add
def construct_builtin_type(tx, cls, args, kwargs):
    """``int(x)``, ``tuple(it)``, ``dict(...)``... or None when ``cls`` is not a builtin type we model."""
    if cls in (int, float, bool, complex, str):
        if args and isinstance(args[0], TensorVariable):
            raise Unsupported(f"{cls.__name__}() of a tensor needs its data",
                              hint="keep the value as a tensor (e.g. .to(dtype)) instead")
        if cls is bool and args and not args[0].is_constant():
            return ConstantVariable(args[0].truth(tx))
        if cls is str and args and not args[0].is_constant():
            raise Unsupported(f"str() of {args[0].describe()}")
        return _fold(cls, *[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
    if cls is tuple and len(args) == 1 and type(args[0]) is TupleVariable:
        return args[0]  # tuple(t) of an exact tuple is t itself
    if cls in (tuple, list):
        items = args[0].unpack(tx) if args else []
        return TupleVariable(items) if cls is tuple else ListVariable(items)
    if cls in (set, frozenset):
        s = SetVariable([], frozen=cls is frozenset)
        if args:  # as set.update: a set argument is merged the way CPython merges it (iteration order)
            s.call_method(tx, "update", [args[0]], {})
        return s
    if cls is collections.deque and len(args) + len(kwargs) <= 2 and set(kwargs) <= {"iterable", "maxlen"}:
        bound = dict(zip(("iterable", "maxlen"), args), **kwargs)
        maxlen = bound["maxlen"].as_constant() if "maxlen" in bound else None
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise Unsupported(f"deque(maxlen={maxlen!r}) (ValueError/TypeError)")
        return DequeVariable(bound["iterable"].unpack(tx) if "iterable" in bound else [], maxlen=maxlen)
    if cls is collections.Counter and (not args or args[0].is_constant() or isinstance(args[0], BaseSequenceVariable)):
        counts = collections.Counter(v.as_constant() for v in (args[0].unpack(tx) if args else []))
        counts.update({k: v.as_constant() for k, v in kwargs.items()})
        return DictVariable({k: ConstantVariable(n) for k, n in counts.items()}, py_type=collections.Counter)
    if cls is dict or (isinstance(cls, type) and issubclass(cls, dict) and cls.__module__ == "collections"
                       and cls.__name__ in ("OrderedDict", "defaultdict")):
        factory = None
        if cls.__name__ == "defaultdict":
            factory = args[0] if args and not (args[0].is_constant() and args[0].as_constant() is None) else None
            args = args[1:]
        d = DictVariable({}, py_type=cls, default_factory=factory)
        if args:
            for k, v in dict_items_of(tx, args[0]):
                d.setitem(tx, k, v)
        for k, v in kwargs.items():
            d.items[k] = v
        return d
    if cls is slice:
        parts = list(args) + [ConstantVariable(None)] * (3 - len(args))
        if len(args) == 1:
            parts = [ConstantVariable(None), args[0], ConstantVariable(None)]
        return SliceVariable(*parts)
    if cls is range:
        return _fold(range, *[a.as_constant() for a in args])
    if cls is object and not args:
        return NewObjectVariable(object)
    if cls is torch.Size:
        items = args[0].unpack(tx) if args else []
        return SizeVariable(items)
    if cls in (torch.device, torch.dtype) or cls in (torch.finfo, torch.iinfo):
        return _fold(cls, *[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
    if cls is super:
        return tx.make_super(args)
    if cls in (operator.itemgetter, operator.attrgetter, operator.methodcaller):
        return OperatorGetterVariable(cls, args, kwargs)
    if cls is functools.partial:
        return PartialVariable(args[0], list(args[1:]), dict(kwargs))
    if cls in (enumerate, zip, reversed, map, filter, type):
        return call_builtin(tx, cls, args, kwargs)
    return make_itertool(tx, cls, args, kwargs)


# ---- builtin functions ---------------------------------------------------------------------
HANDLERS: dict = BUILTIN_HANDLERS  # filled by ``@handler`` here and in object_builtins.py


@helpers.add
def call_builtin(tx, fn, args, kwargs):
    if len(args) == 1 and not kwargs and (r := helpers.numpy_unary(tx, fn, args[0])) is not None:
        return r
    h = HANDLERS.get(fn)
    if h is not None:
        return h(tx, fn, *args, **kwargs)
    if fn in _BINARY_FUNCS and len(args) == 2 and not kwargs:
        return apply_operator(tx, fn, args[0], args[1])
    if all(a.is_constant() or a.is_symbolic() for a in [*args, *kwargs.values()]) and _is_pure(fn):
        # (symbolic sizes in containers are specialized here: guarded, never wrong)
        return _fold(fn, *[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
    if getattr(math, getattr(fn, "__name__", ""), None) is fn and any(isinstance(a, TensorVariable) for a in args):
        raise Unsupported(f"math.{fn.__name__}() of a tensor needs its data", hint=f"use torch.{fn.__name__} instead")
    raise Unsupported(f"builtin {getattr(fn, '__name__', fn)}() with these arguments ({', '.join(a.describe() for a in args)})")


_BINARY_FUNCS = set(BINARY.values()) | set(INPLACE.values()) | set(COMPARE.values())
_IMPURE = {builtins.print, builtins.input, builtins.open, builtins.exec, builtins.eval, builtins.id, builtins.vars,
           builtins.globals, builtins.locals, builtins.breakpoint, builtins.setattr, builtins.delattr, builtins.compile,
           builtins.__import__, builtins.help, builtins.dir}


def _is_pure(fn) -> bool:
    if fn in _IMPURE:
        return False
    name = getattr(fn, "__name__", "")
    return (getattr(builtins, name, None) is fn or getattr(math, name, None) is fn
            or getattr(operator, name, None) is fn)


@handler(len)
def _len(tx, fn, x):
    return ConstantVariable(x.length(tx))


@handler(isinstance)
def _isinstance(tx, fn, obj, classes):
    cls = classes.as_constant() if classes.is_constant() else tuple(c.as_constant() for c in classes.unpack(tx))
    try:
        t = obj.python_type()
    except Unsupported:
        raise Unsupported(f"isinstance() on {obj.describe()}")
    if isinstance(obj, TensorVariable) and isinstance(cls, type) and cls is torch.nn.Parameter:
        return ConstantVariable(isinstance(obj.fake, torch.nn.Parameter) or obj.python_type() is torch.nn.Parameter)
    each = cls if isinstance(cls, tuple) else (cls,)
    if any(_own_instancecheck(c) for c in each):
        return ConstantVariable(any(_instancecheck(obj, t, c) for c in each))
    try:
        return ConstantVariable(issubclass(t, cls))
    except TypeError:
        # typing constructs and protocol classes: ask the real isinstance on a stand-in when possible
        real = getattr(obj, "value", None)
        if real is not None:
            return ConstantVariable(isinstance(real, cls))
        raise Unsupported(f"isinstance() against {cls!r}")


def _own_instancecheck(c) -> bool:
    """A class whose metaclass answers isinstance() by more than the type (torch.FloatTensor checks
    dtype and device, torch.BoolStorage the storage's dtype): issubclass(type(obj), c) is not the answer."""
    meta = type(c).__instancecheck__
    return isinstance(c, type) and meta is not type.__instancecheck__ and meta is not abc.ABCMeta.__instancecheck__


def _instancecheck(obj, t, c) -> bool:
    """isinstance(obj, c) for one class of the tuple."""
    if not _own_instancecheck(c):
        return issubclass(t, c)
    if t is c:  # CPython answers an exact type match before asking the metaclass
        return True
    if isinstance(obj, TensorVariable) and type(c) is type(torch.FloatTensor):
        # a legacy tensor type (torch.FloatTensor, torch.cuda.HalfTensor, torch.sparse.FloatTensor):
        # its dtype, layout and device type; all three are in the tensor's guard
        f = obj.fake
        return (f.dtype == c.dtype and (f.layout is not torch.strided) == c.is_sparse and
                f.device.type == ("cuda" if c.is_cuda else "cpu"))
    real = getattr(obj, "value", None) if isinstance(obj, (OpaqueObjectVariable, UserObjectVariable)) else None
    if real is None and obj.is_constant():
        real = obj.as_constant()
    if real is None:
        raise Unsupported(f"isinstance() of {obj.describe()} against {c.__qualname__}, whose metaclass "
                          "defines __instancecheck__")
    return isinstance(real, c)


@handler(issubclass)
def _issubclass(tx, fn, a, b):
    return _fold(issubclass, a.as_constant(), b.as_constant() if b.is_constant() else tuple(c.as_constant() for c in b.unpack(tx)))


@handler(callable)
def _callable(tx, fn, x):
    if x.is_constant():
        return ConstantVariable(callable(x.as_constant()))

    callables = (F.BaseUserFunctionVariable, F.UserMethodVariable, F.BuiltinVariable, F.TorchFunctionVariable,
                 F.BoundMethodVariable, F.PartialVariable, F.ConstantMethodVariable, TensorMethodVariable)
    if isinstance(x, callables):
        return ConstantVariable(True)
    # what CPython checks (a type slot): __call__ defined on the value's class, not reached through
    # the metaclass (hasattr(cls, "__call__") holds for every class: type.__call__)
    return ConstantVariable(any("__call__" in vars(c) for c in x.python_type().__mro__))


@handler(type)
def _type(tx, fn, *args):
    if len(args) != 1:
        raise Unsupported("type() with 3 arguments (creating a class)")

    return VariableTracker.build_object(tx, args[0].python_type())


_MISSING = object()


def lookup_attr(tx, obj, name: str):
    """``obj.name``, or _MISSING where that raises AttributeError (what getattr() with a default and
    hasattr() catch, be it ember's own protocol signal or a traced ``raise AttributeError``)."""
    try:
        return obj.getattr(tx, name)
    except AttributeError:
        pass
    except TracedException as exc:
        if not issubclass(exc.exc_type, AttributeError):
            raise
    guard_no_attr(tx, obj, name)  # the trace goes on without it: setting it later must recompile
    return _MISSING


@handler(getattr)
def _getattr(tx, fn, obj, name, *default):
    found = lookup_attr(tx, obj, name.as_constant())
    if found is not _MISSING:
        return found
    if default:
        return default[0]
    raise TracedException(AttributeError, [name],
                          f"getattr(): {obj.describe()} has no attribute {name.as_constant()!r} (AttributeError)")


@handler(hasattr)
def _hasattr(tx, fn, obj, name):
    name = name.as_constant()
    try:
        return ConstantVariable(lookup_attr(tx, obj, name) is not _MISSING)
    except Unsupported:
        # the value is not modelled, but a method or plain class attribute exists whatever the
        # instance holds (a data descriptor, e.g. a property or an unset slot, may raise: not that)
        try:
            static, owner = lookup_static(obj.python_type(), name)
        except Unsupported:
            static = owner = None
        descriptor = hasattr(type(static), "__set__") or hasattr(type(static), "__delete__")
        if owner is None or (descriptor and name != "__dict__"):  # (an instance dict is always there)
            raise
        return ConstantVariable(True)


@handler(iter)
def _iter(tx, fn, x, *sentinel):
    if sentinel:
        raise Unsupported("iter(callable, sentinel)")
    return x.iter(tx)


@handler(next)
def _next(tx, fn, it, *default):
    if isinstance(it, IteratorVariable):
        item = it.next(tx)
        if item is None:
            if default:
                return default[0]
            raise TracedException(StopIteration, [], "next() on an exhausted iterator (StopIteration)")
        return item
    return it.call_method(tx, "__next__", [], {})


@handler(range)
def _range(tx, fn, *args):
    return _fold(range, *[a.as_constant() for a in args])


@handler(enumerate)
def _enumerate(tx, fn, it, start=None):
    return EnumerateIteratorVariable(it.iter(tx), start.as_constant() if start is not None else 0)


@handler(zip)
def _zip(tx, fn, *its, strict=None):
    return ZipIteratorVariable([i.iter(tx) for i in its], bool(strict.as_constant()) if strict is not None else False)


@handler(reversed)
def _reversed(tx, fn, seq):
    return ListIteratorVariable(list(reversed(seq.unpack(tx))))


@handler(map)
def _map(tx, fn, f, *its):
    return MapIteratorVariable(f, [i.iter(tx) for i in its])


@handler(filter)
def _filter(tx, fn, f, it):
    return FilterIteratorVariable(f, it.iter(tx))


@handler(sorted)
def _sorted(tx, fn, it, key=None, reverse=None):
    return ListVariable(sort_items(tx, it.unpack(tx), key, reverse.as_constant() if reverse is not None else False))


def _min_max(tx, fn, *args, key=None, default=None):
    items = args[0].unpack(tx) if len(args) == 1 else list(args)
    if not items:
        if default is not None:
            return default
        raise Unsupported(f"{fn.__name__}() of an empty sequence (ValueError)")
    if key is None and all(isinstance(i, TensorVariable) for i in items):
        return helpers.tensor_min_max(tx, fn, items)
    if any(isinstance(i, TensorVariable) for i in items) and key is None:
        raise Unsupported(f"{fn.__name__}() over tensors compares their data", hint=f"use torch.{fn.__name__}imum")
    if key is not None:
        keyed = [(key.call(tx, [i], {}).as_constant(), i) for i in items]
        best = fn(keyed, key=lambda p: p[0])
        return best[1]
    return _fold(fn, [i.as_constant() for i in items])


HANDLERS[min] = _min_max
HANDLERS[max] = _min_max


@handler(sum)
def _sum(tx, fn, it, start=None):
    acc = start if start is not None else ConstantVariable(0)
    for x in it.unpack(tx):
        acc = apply_operator(tx, operator.add, acc, x)
    return acc


@handler(any, all)
def _any_all(tx, fn, it):
    stop = fn is any  # the truth value that ends the scan: later items are never pulled
    for v in iterate(tx, it.iter(tx)):
        if isinstance(v, TensorVariable):
            raise Unsupported(f"{fn.__name__}() over tensors needs their data", hint=f"use torch.{fn.__name__}")
        if bool(v.truth(tx)) is stop:
            return ConstantVariable(stop)
    return ConstantVariable(not stop)


@handler(abs, operator.abs, operator.neg, operator.pos, operator.invert, operator.not_, round)
def _unary(tx, fn, x, *rest):
    if isinstance(x, SymIntVariable) and not rest:
        return symbolic.unary(tx, fn, x)
    if isinstance(x, TensorVariable):
        if fn is operator.not_:
            return ConstantVariable(not x.truth(tx))
        return tx.output.call(tx, "call_function", fn, [x, *rest], {})
    if fn is operator.not_:
        return ConstantVariable(not x.truth(tx))
    return _fold(fn, x.as_constant(), *[r.as_constant() for r in rest])


@handler(operator.getitem)
def _getitem(tx, fn, obj, key):
    return tx.getitem(obj, key)


@handler(operator.setitem)
def _setitem(tx, fn, obj, key, value):
    tx.setitem(obj, key, value)
    return ConstantVariable(None)


@handler(operator.contains)
def _contains(tx, fn, container, item):
    return contains(tx, container, item)


@handler(operator.is_, operator.is_not)
def _is(tx, fn, a, b):
    r = is_op(tx, a, b)
    return ConstantVariable(r if fn is operator.is_ else not r)


@handler(operator.truth)
def _truth(tx, fn, x):
    return ConstantVariable(x.truth(tx))


@handler(operator.index)
def _index(tx, fn, x):
    return _fold(operator.index, x.as_constant())


@handler(divmod)
def _divmod(tx, fn, a, b):
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        return TupleVariable([apply_operator(tx, operator.floordiv, a, b), apply_operator(tx, operator.mod, a, b)])
    return _fold(divmod, a.as_constant(), b.as_constant())


@handler(pow)
def _pow(tx, fn, a, b, mod=None):
    if mod is None:
        return apply_operator(tx, operator.pow, a, b)
    return _fold(pow, a.as_constant(), b.as_constant(), mod.as_constant())


@handler(dataclasses.fields)
def _dc_fields(tx, fn, x):
    return VariableTracker.const(dataclasses.fields(x.as_constant() if x.is_constant() else x.python_type()))


@handler(dataclasses.is_dataclass)
def _dc_is(tx, fn, x):
    return ConstantVariable(dataclasses.is_dataclass(x.as_constant() if x.is_constant() else x.python_type()))


@handler(builtins.print)
def _print(tx, fn, *args, **kwargs):
    raise Unsupported("print() has a side effect a graph cannot hold",
                      hint="graph breaks will run it as Python; for now move it out of the compiled function")


@handler(inspect.signature)
def _signature(tx, fn, f, **kwargs):
    """Signatures are static facts about a function: fold them."""
    if isinstance(f, F.UserFunctionVariable):
        return OpaqueObjectVariable(inspect.signature(f.fn))
    if isinstance(f, F.UserMethodVariable):
        sig = inspect.signature(f.fn)
        return OpaqueObjectVariable(sig.replace(parameters=list(sig.parameters.values())[1:]))
    if isinstance(f, F.NestedFunctionVariable):
        raise Unsupported("inspect.signature() of a function made inside the compiled function")
    real = getattr(f, "value", None) or getattr(f, "fn", None)
    if real is None:
        raise Unsupported(f"inspect.signature() of {f.describe()}")
    return OpaqueObjectVariable(inspect.signature(real))


@handler(functools.reduce)
def _reduce(tx, fn, f, it, *initial):
    items = it.unpack(tx)
    if initial:
        acc = initial[0]
    elif items:
        acc, items = items[0], items[1:]
    else:
        raise Unsupported("reduce() of empty iterable with no initial value (TypeError)")
    for x in items:
        acc = f.call(tx, [acc, x], {})
    return acc


@handler(dict.fromkeys)
def _fromkeys(tx, fn, keys, value=None):
    d = DictVariable({})
    for k in keys.unpack(tx):
        d.setitem(tx, k, value if value is not None else ConstantVariable(None))
    return d


from ember.frontend import object_builtins  # noqa: E402,F401  (registers the object-protocol handlers)
