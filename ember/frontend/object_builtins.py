"""Builtins of the object protocol: ``id``, ``setattr``/``delattr``, ``vars``, ``object.__getattribute__``
and friends (reached through ``super()`` in classes with their own dunders), ``copy.copy`` and
``copy.deepcopy``.

Copies are made on trackers: copying an object yields a new object made in the trace whose
attributes are copies of the original's, each read through a guarded source, which is what
``copy.deepcopy`` reads too. Only objects that copy by their ``__dict__`` are handled (no
``__deepcopy__``/``__reduce__``/``__getstate__``/``__slots__``, no C base); tensors and modules break.
"""
from __future__ import annotations

import copy
import copyreg

from ember.frontend.errors import TracedException, Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import AttrSource
from ember.frontend.variables import functions as F
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.deques import DequeVariable
from ember.frontend.variables.dict_subclasses import UserDictVariable
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.functions import handler
from ember.frontend.variables.modules import NNModuleVariable
from ember.frontend.variables.objects import (
    NewObjectVariable, ObjectDictVariable, PythonModuleVariable, UserClassVariable, UserObjectVariable, lookup_static,
)
from ember.frontend.variables.sequences import ListVariable, NamedTupleVariable, SizeVariable, TupleVariable
from ember.frontend.variables.sets import SetVariable

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python
# copy treats these as atomic: the copy is the object itself
_ATOMIC = (ConstantVariable, F.BaseUserFunctionVariable, F.BuiltinVariable, F.TorchFunctionVariable,
           UserClassVariable)


# ---- identity and attributes ------------------------------------------------------------------
@handler(id)
def _id(tx, fn, obj):
    """The id of an existing object, pinned by an identity guard; objects made in the trace have none
    yet (their id at run time is unknown while tracing)."""
    real = _existing_object(obj)
    if real is None:
        raise Unsupported(f"id() of {obj.describe()}")
    tx.output.guards.add(obj.source, GuardKind.ID, real)
    return ConstantVariable(id(real))


def _existing_object(vt):
    if vt.source is None:
        return None
    if isinstance(vt, (UserObjectVariable, UserClassVariable, PythonModuleVariable)):
        return vt.value
    if isinstance(vt, NNModuleVariable):
        return vt.module
    if isinstance(vt, F.UserFunctionVariable):
        return vt.fn
    return None


@handler(setattr)
def _setattr(tx, fn, obj, name, value):
    obj.setattr(tx, name.as_constant(), value)
    return ConstantVariable(None)


@handler(delattr)
def _delattr(tx, fn, obj, name):
    obj.delattr(tx, name.as_constant())
    return ConstantVariable(None)


@handler(object.__getattribute__)
def _object_getattribute(tx, fn, obj, name):
    if not hasattr(obj, "generic_getattr"):
        raise Unsupported(f"object.__getattribute__ on {obj.describe()}")
    try:
        return obj.generic_getattr(tx, name.as_constant())
    except AttributeError as exc:
        raise TracedException(AttributeError, [ConstantVariable(str(exc))], f"{exc} (AttributeError)") from None


@handler(object.__setattr__)
def _object_setattr(tx, fn, obj, name, value):
    if isinstance(obj, NewObjectVariable):
        obj.attrs[name.as_constant()] = value
        return ConstantVariable(None)
    raise Unsupported(f"object.__setattr__ on {obj.describe()}")


@handler(object.__delattr__)
def _object_delattr(tx, fn, obj, name):
    if isinstance(obj, NewObjectVariable):
        obj.generic_delattr(tx, name.as_constant())
        return ConstantVariable(None)
    raise Unsupported(f"object.__delattr__ on {obj.describe()}")


@handler(object.__new__)
def _object_new(tx, fn, cls, *args):
    return NewObjectVariable(cls.as_constant())


@handler(vars)
def _vars(tx, fn, obj=None):
    if isinstance(obj, NewObjectVariable):
        return ObjectDictVariable(obj)
    raise Unsupported(f"vars() of {obj.describe() if obj is not None else 'the frame'}")


# ---- copies -----------------------------------------------------------------------------------
@handler(copy.copy)
def _copy(tx, fn, x):
    if isinstance(x, _ATOMIC) or type(x) in (TupleVariable, SizeVariable):
        return x
    if isinstance(x, NamedTupleVariable):  # not an exact tuple: copy rebuilds it (a new object)
        return NamedTupleVariable(x.cls, x.items, attrs=x.attrs)
    if isinstance(x, DequeVariable):
        return DequeVariable(list(x.items), maxlen=x.maxlen)
    if isinstance(x, ListVariable):
        return ListVariable(x.items)
    if isinstance(x, DictVariable):  # (a dict subclass's copy keeps its class and instance attributes)
        cls = UserDictVariable if isinstance(x, UserDictVariable) else DictVariable
        new = cls(x.items, py_type=x.py_type, key_vts=x.key_vts, default_factory=x.default_factory)
        if isinstance(x, UserDictVariable):
            new.attrs.update(x.attrs)
        return new
    if isinstance(x, SetVariable):
        return x.copy()
    new = NewObjectVariable(_copied_class(x))
    new.attrs.update(_state(tx, x))
    return new


@handler(copy.deepcopy)
def _deepcopy(tx, fn, x, memo=None):
    if memo is not None and not (memo.is_constant() and memo.as_constant() is None):
        raise Unsupported("copy.deepcopy() with a memo dict")
    return deepcopy_vt(tx, x, {})


def deepcopy_vt(tx, x: VariableTracker, memo: dict) -> VariableTracker:
    """``copy.deepcopy`` on a tracker; ``memo`` (id of tracker -> copy) keeps shared parts shared."""
    if isinstance(x, _ATOMIC):
        return x
    if id(x) in memo:
        return memo[id(x)]
    if type(x) in (TupleVariable, SizeVariable):
        return type(x)([deepcopy_vt(tx, i, memo) for i in x.items])
    if isinstance(x, NamedTupleVariable):
        return NamedTupleVariable(x.cls, [deepcopy_vt(tx, i, memo) for i in x.items],
                                  attrs={k: deepcopy_vt(tx, v, memo) for k, v in x.attrs.items()})
    if isinstance(x, ListVariable):
        new = memo[id(x)] = DequeVariable([], maxlen=x.maxlen) if isinstance(x, DequeVariable) else ListVariable([])
        new.items = [deepcopy_vt(tx, i, memo) for i in x.items]
        return new
    if isinstance(x, DictVariable):
        cls = UserDictVariable if isinstance(x, UserDictVariable) else DictVariable
        new = memo[id(x)] = cls({}, py_type=x.py_type, key_vts=x.key_vts, default_factory=x.default_factory)
        for k, v in list(x.items.items()):
            new.items[k] = deepcopy_vt(tx, v, memo)
        if isinstance(x, UserDictVariable):  # a dict subclass's instance attributes
            for k, v in list(x.attrs.items()):
                new.attrs[k] = deepcopy_vt(tx, v, memo)
        return new
    if isinstance(x, SetVariable):  # of constants
        return x.copy()
    new = memo[id(x)] = NewObjectVariable(_copied_class(x))
    for k, v in _state(tx, x).items():
        new.attrs[k] = deepcopy_vt(tx, v, memo)
    return new


def _copied_class(x: VariableTracker) -> type:
    """The class of an object that copy rebuilds as ``cls.__new__(cls)`` plus a copy of its ``__dict__``."""
    if not isinstance(x, (UserObjectVariable, NewObjectVariable)):
        raise Unsupported(f"copying {x.describe()}")
    cls = x.python_type()
    own = [n for n in ("__copy__", "__deepcopy__", "__reduce_ex__", "__reduce__", "__getstate__", "__setstate__")
           if lookup_static(cls, n)[1] not in (None, object)]
    if own or cls in copyreg.dispatch_table or cls.__new__ is not object.__new__ or not cls.__dictoffset__ \
            or any(not k.__flags__ & _HEAPTYPE or "__slots__" in k.__dict__ for k in cls.__mro__[:-1]):
        raise Unsupported(f"copying {x.describe()}: its class defines how it is copied ({', '.join(own) or 'a C type'})")
    return cls


def _state(tx, x) -> dict:
    """The attributes a copy starts from: an existing object's ``__dict__`` read through guarded
    sources, with the writes this trace made to it on top."""

    if isinstance(x, NewObjectVariable):
        return dict(x.attrs)
    d = VariableTracker.build(tx, x.value.__dict__, AttrSource(x.source, "__dict__"))
    return {**d.items, **tx.output.side_effects.written_attrs(x.value)}
