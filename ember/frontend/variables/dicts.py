"""Dicts (and OrderedDict, defaultdict, Counter) of variable trackers, keyed by constants or by
objects that hash by identity. Their methods dispatch through ``DictVariable.METHODS``."""
from __future__ import annotations

import collections

import enum
import types

import torch

from ember.frontend.errors import TracedException, Unsupported
from ember.frontend.guards import GuardKind, IdentityKeys
from ember.frontend.sources import AttrSource, DictKeysSource, DictValuesSource, ItemSource
from ember.frontend.variables.base import (
    ContainerMethods, ConstantVariable, MethodTable, VariableTracker, guard, helpers, register_builder, trackers,
)


def const_key(tx, k: VariableTracker):
    """The Python key a tracker stands for in a dict or set: its constant, or what it hashes as."""
    if k.is_constant():
        return k.as_constant()
    return helpers.hashable_key(k)


class DictVariable(ContainerMethods, VariableTracker):
    """A dict with constant keys. ``items`` maps the Python key to (key VT, value VT)."""

    METHODS = MethodTable()

    def __init__(self, items: dict, source=None, py_type: type = dict, key_vts: dict | None = None,
                 default_factory=None):
        self.default_factory = default_factory  # defaultdict's factory tracker
        self.items = dict(items)  # python key -> value VT
        self.key_vts = dict(key_vts or {})
        self.source = source
        self.py_type = py_type

    def python_type(self):
        return self.py_type

    def describe(self):
        return f"{self.py_type.__name__} with keys {list(self.items)[:6]}"

    def before_mutation(self, tx):
        if self.source is not None:  # a dict from outside: replay its final contents after the graph
            tx.output.side_effects.track_container(self)

    def key_vt(self, k):
        return self.key_vts.get(k) or ConstantVariable(k)

    def iter(self, tx):
        return trackers.DictIteratorVariable(self, "keys")

    def unpack(self, tx):
        return [self.key_vt(k) for k in self.items]

    def length(self, tx):
        return len(self.items)

    def truth(self, tx):
        return bool(self.items)

    def as_node_arg(self):
        return {k: v.as_node_arg() for k, v in self.items.items()}

    def as_fake_arg(self):
        return {k: v.as_fake_arg() for k, v in self.items.items()}

    def is_constant(self):
        return False

    def getitem(self, tx, key):
        k = const_key(tx, key)
        if k not in self.items:
            if self.default_factory is not None:
                self.setitem(tx, key, self.default_factory.call(tx, [], {}))
                return self.items[k]
            if self.py_type.__name__ == "Counter" and self.py_type.__module__ == "collections":
                return ConstantVariable(0)  # Counter.__missing__: 0, without inserting
            raise TracedException(KeyError, [key], f"dict key {k!r} not found (KeyError)")
        return self.items[k]

    def setitem(self, tx, key, value):
        self.before_mutation(tx)
        k = const_key(tx, key)
        self.items[k] = value
        if not key.is_constant():
            self.key_vts[k] = key

    def getattr(self, tx, name):
        if name == "default_factory" and issubclass(self.py_type, collections.defaultdict):
            return self.default_factory if self.default_factory is not None else ConstantVariable(None)
        if hasattr(self.py_type, name):
            return trackers.BoundMethodVariable(self, name)
        raise AttributeError(f"'{self.py_type.__name__}' object has no attribute '{name}'")

    @METHODS("get")
    def _get(self, tx, args, kwargs):
        k = const_key(tx, args[0])
        return self.items[k] if k in self.items else (args[1] if len(args) > 1 else ConstantVariable(None))

    @METHODS("keys")
    def _keys(self, tx, args, kwargs):
        return trackers.DictViewVariable(self, "keys")

    @METHODS("values")
    def _values(self, tx, args, kwargs):
        return trackers.DictViewVariable(self, "values")

    @METHODS("items")
    def _items(self, tx, args, kwargs):
        return trackers.DictViewVariable(self, "items")

    @METHODS("__contains__")
    def _contains(self, tx, args, kwargs):
        return ConstantVariable(const_key(tx, args[0]) in self.items)

    @METHODS("__len__")
    def _len(self, tx, args, kwargs):
        return ConstantVariable(len(self.items))

    @METHODS("__iter__")
    def _iter(self, tx, args, kwargs):
        return self.iter(tx)

    @METHODS("copy")
    def _copy(self, tx, args, kwargs):  # a defaultdict's copy keeps its factory
        return DictVariable(self.items, py_type=self.py_type, key_vts=self.key_vts,
                            default_factory=self.default_factory)

    @METHODS("update", mutates=True)
    def _update(self, tx, args, kwargs):
        if args:
            for k, v in helpers.dict_items_of(tx, args[0]):
                self.setitem(tx, k, v)
        for k, v in kwargs.items():
            self.items[k] = v
        return ConstantVariable(None)

    @METHODS("setdefault", mutates=True)
    def _setdefault(self, tx, args, kwargs):
        k = const_key(tx, args[0])
        if k not in self.items:
            self.setitem(tx, args[0], args[1] if len(args) > 1 else ConstantVariable(None))
        return self.items[k]

    @METHODS("pop", mutates=True)
    def _pop(self, tx, args, kwargs):
        k = const_key(tx, args[0])
        if k in self.items:
            self.key_vts.pop(k, None)
            return self.items.pop(k)
        if len(args) > 1:
            return args[1]
        raise TracedException(KeyError, [args[0]], f"dict.pop(): key {k!r} not found (KeyError)")

    @METHODS("__setitem__", mutates=True)
    def _setitem(self, tx, args, kwargs):
        self.setitem(tx, args[0], args[1])
        return ConstantVariable(None)

    @METHODS("__delitem__", mutates=True)
    def _delitem(self, tx, args, kwargs):
        del self.items[const_key(tx, args[0])]
        return ConstantVariable(None)

    @METHODS("clear", mutates=True)
    def _clear(self, tx, args, kwargs):
        self.items.clear()
        return ConstantVariable(None)

    @METHODS("move_to_end", mutates=True)
    def _move_to_end(self, tx, args, kwargs):
        k = const_key(tx, args[0])
        last = (args[1] if len(args) > 1 else kwargs.get("last", ConstantVariable(True))).as_constant()
        v = self.items.pop(k)
        self.items = {k: v, **self.items} if not last else {**self.items, k: v}
        return ConstantVariable(None)

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return cg.load(self.source)

        def build():
            body = self.items_literal(cg)
            if self.py_type is dict:
                return body
            if self.default_factory is not None:
                return f"{cg.const(self.py_type, 'dict_type')}({cg.reconstruct(self.default_factory)}, {body})"
            if issubclass(self.py_type, collections.defaultdict):  # no factory: its first argument is still one
                return f"{cg.const(self.py_type, 'dict_type')}(None, {body})"
            return f"{cg.const(self.py_type, 'dict_type')}({body})"

        return cg.memo(self, build)

    def items_literal(self, cg) -> str:
        return "{" + ", ".join(f"{cg.reconstruct(self.key_vt(k))}: {cg.reconstruct(v)}" for k, v in self.items.items()) + "}"




# -- builder: dicts read from the frame (guarded) or made while tracing --

def _is_identity_key(k) -> bool:
    """A dict key that hashes and compares by identity and is fixed once the dict's keys are guarded:
    classes, functions, typing's special forms (e.g. a table of validators keyed by type)."""
    return isinstance(k, (type, types.FunctionType, types.BuiltinFunctionType)) or type(k).__module__ == "typing"



@register_builder(dict)
def _build_dict(tx, value, source):
    if source is None:
        if type(value) is not dict:
            return None
        return DictVariable({k: VariableTracker.const(v) for k, v in value.items()})
    if type(value) is not dict and type(value).__module__ != "collections":
        return None  # a user subclass: a user object (or a ModelOutput)
    guard(tx, source, GuardKind.TYPE, type(value))
    keys = list(value.keys())
    if any(isinstance(k, torch.Tensor) for k in keys):
        items, key_vts = _tensor_keyed_items(tx, value, source, keys)
    else:
        if not all(isinstance(k, (int, str, float, bool, type(None), enum.Enum, tuple)) or _is_identity_key(k)
                   for k in keys):
            raise Unsupported(f"dict with non-constant keys at {source.name()}")
        guard(tx, source, GuardKind.DICT_KEYS, tuple(keys))
        items = {k: VariableTracker.build(tx, value[k], ItemSource(source, k)) for k in keys}
        key_vts = {k: VariableTracker.build_object(tx, k) for k in keys if _is_identity_key(k)}
    factory = getattr(value, "default_factory", None)  # a defaultdict's: a missing key calls it
    factory = VariableTracker.build(tx, factory, AttrSource(source, "default_factory")) if factory is not None else None
    return DictVariable(items, source, py_type=type(value), key_vts=key_vts, default_factory=factory)


def _tensor_keyed_items(tx, value: dict, source, keys: list):
    """Items of a dict keyed by tensors (an optimizer's ``state``, keyed by its parameters). A tensor
    hashes and compares as its identity in a dict, so the keys are guarded to be the same objects in
    the same order (``==`` would compare elements), and each is a graph input reached by position
    (``tuple(d)[i]``; the same tensor reached elsewhere, ``group["params"][i]``, is that one input,
    with an ALIAS guard), so a key tracker and a tracker met elsewhere hash alike. The values are
    read by position too (``tuple(d.values())[i]``)."""
    guard(tx, source, GuardKind.DICT_KEYS, IdentityKeys(tuple(keys)))
    items, key_vts = {}, {}
    for i, k in enumerate(keys):
        if isinstance(k, torch.Tensor):
            kvt = VariableTracker.build(tx, k, ItemSource(DictKeysSource(source), i))
            if not isinstance(kvt, trackers.TensorVariable):
                raise Unsupported(f"dict keyed by a tensor ember cannot trace ({kvt.describe()}) at {source.name()}")
            pk = helpers.hashable_key(kvt)
        elif isinstance(k, (int, str, float, bool, type(None), enum.Enum)) or _is_identity_key(k):
            pk, kvt = k, (VariableTracker.build_object(tx, k) if _is_identity_key(k) else None)
        else:
            raise Unsupported(f"dict with non-constant keys at {source.name()}")
        if kvt is not None:
            key_vts[pk] = kvt
        items[pk] = VariableTracker.build(tx, value[k], ItemSource(DictValuesSource(source), i))
    return items, key_vts
