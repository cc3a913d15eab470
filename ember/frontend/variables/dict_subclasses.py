"""Instances of a user's ``dict`` subclass made inside the compiled function (``class Config(dict)``).

Such an object is a dict whose type is the user's class: items behave as a dict's, the class's own
Python methods are inlined with the object as ``self``, its ``__init__`` runs when it is made
(``super().__init__(...)`` is ``dict.__init__``, i.e. ``update``). Only classes that change no dict
behaviour are modelled: a dunder of their own other than ``__init__`` and ``__missing__``
(``__getitem__``, ``__setitem__``...), a ``__slots__`` or a C base other than ``dict`` itself make the
construction a graph break. ``__missing__`` is what ``d[key]`` (only it, as in eager) calls for a
missing key: inlined with the object and the key. Instance attributes (``d.tag = 1``) live on the tracker. Returned, the
object is rebuilt without running ``__init__`` again (it ran in the trace).
"""
from __future__ import annotations

import types

from ember.frontend.errors import Unsupported
from ember.frontend.variables.base import MethodTable, VariableTracker, helpers, trackers
from ember.frontend.variables.dicts import DictVariable, const_key

# class-body names that change nothing about how the instances behave as dicts
_INERT = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__", "__init__",
          "__firstlineno__", "__static_attributes__", "__orig_bases__", "__parameters__", "__type_params__",
          "__annotate__", "__annotate_func__", "__annotations_cache__",
          "__slotnames__",  # (copyreg caches __slotnames__ on a class once an instance is copied)
          "__missing__"}  # (a Python function: inlined by UserDictVariable.getitem)


@helpers.add
def is_plain_dict_subclass(cls) -> bool:
    """A Python subclass of exactly ``dict`` whose classes define no dunder but ``__init__``."""
    if not isinstance(cls, type) or cls is dict or not issubclass(cls, dict) or type(cls) is not type:
        return False
    for klass in cls.__mro__:
        if klass in (dict, object):
            continue
        if not isinstance(klass.__dict__.get("__module__"), str) or klass.__module__ == "collections":
            return False  # a C class, or collections' own dicts (modelled elsewhere)
        if any(n.startswith("__") and n.endswith("__") and n not in _INERT for n in klass.__dict__):
            return False
        if "__missing__" in klass.__dict__ and not isinstance(klass.__dict__["__missing__"], types.FunctionType):
            return False  # a staticmethod, a C function...: not inlined
    return True


def _python_attr(cls, name):
    for klass in cls.__mro__:
        if klass in (dict, object):
            return None
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


class UserDictVariable(DictVariable):
    METHODS = MethodTable()

    def describe(self):
        return f"{self.py_type.__name__} (dict subclass) with keys {list(self.items)[:6]}"

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        attr = _python_attr(self.py_type, name)
        if isinstance(attr, types.FunctionType):
            return trackers.UserMethodVariable(attr, self)
        if isinstance(attr, (staticmethod, classmethod, property)):
            raise Unsupported(f"{type(attr).__name__} '{name}' of {self.describe()}")
        if attr is not None:
            return VariableTracker.const(attr) if isinstance(attr, (int, float, str, bool, tuple)) else \
                VariableTracker.build_object(tx, attr)
        return super().getattr(tx, name)

    @property
    def attrs(self) -> dict:  # instance attributes (the object's __dict__), name -> tracker
        if "_attrs" not in self.__dict__:
            self._attrs = {}
        return self._attrs

    def setattr(self, tx, name, value):
        if name.startswith("__") or _python_attr(self.py_type, name) is not None:
            raise Unsupported(f"setting attribute '{name}' on {self.describe()}")
        self.before_mutation(tx)
        self.attrs[name] = value

    def delattr(self, tx, name):
        if name not in self.attrs:
            raise Unsupported(f"deleting attribute '{name}' of {self.describe()}")
        del self.attrs[name]

    def getitem(self, tx, key):
        missing = _python_attr(self.py_type, "__missing__")
        if isinstance(missing, types.FunctionType) and const_key(tx, key) not in self.items:
            return trackers.UserMethodVariable(missing, self).call(tx, [key], {})
        return super().getitem(tx, key)

    def call_method(self, tx, name, args, kwargs):
        attr = _python_attr(self.py_type, name)
        if isinstance(attr, types.FunctionType):
            return trackers.UserMethodVariable(attr, self).call(tx, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    @METHODS("__dict_init__")
    def _dict_init(self, tx, args, kwargs):
        """``dict.__init__`` (what ``super().__init__(...)`` reaches): dict's own update, never an
        ``update`` the subclass defines."""
        return DictVariable.call_method(self, tx, "update", args, kwargs)

    @METHODS("copy")
    def _copy(self, tx, args, kwargs):  # dict.copy of a subclass is a plain dict
        return DictVariable(self.items, key_vts=self.key_vts)

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        def build():
            attrs = "{" + "".join(f"{k!r}: {cg.reconstruct(v)}, " for k, v in self.attrs.items()) + "}"
            return (f"{cg.const(rebuild_dict, 'rebuild_dict')}({cg.const(self.py_type, 'dict_type')}, "
                    f"{self.items_literal(cg)}, {attrs})")

        return cg.memo(self, build)


def rebuild_dict(cls, items: dict, attrs: dict):
    """An instance of ``cls`` holding ``items`` and instance attributes ``attrs``, made without
    calling ``cls.__init__`` (it ran in the trace)."""
    d = dict.__new__(cls)
    dict.update(d, items)
    d.__dict__.update(attrs)
    return d


@helpers.add
def make_user_dict(tx, cls, args: list, kwargs: dict) -> UserDictVariable:
    """``cls(*args, **kwargs)`` for a plain dict subclass: an empty one, then its ``__init__``."""
    d = UserDictVariable({}, py_type=cls)
    init = _python_attr(cls, "__init__")
    if isinstance(init, types.FunctionType):
        fn_vt = trackers.UserMethodVariable(init, d)
        result = fn_vt.call(tx, args, kwargs)
        if not (result.is_constant() and result.as_constant() is None):
            raise Unsupported(f"{cls.__name__}.__init__ returned a value (TypeError)")
    else:
        d.call_method(tx, "__dict_init__", args, kwargs)
    return d

