"""Hugging Face ModelOutputs: dataclasses that are also OrderedDicts of their non-None fields."""
from __future__ import annotations

import collections
import dataclasses

from ember.frontend.errors import Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import AttrSource, ItemSource
from ember.frontend.variables.base import (
    ConstantVariable, MethodTable, VariableTracker, helpers, register_builder, trackers,
)
from ember.frontend.variables.objects import class_attr_of_instance


@helpers.add
def is_model_output_cls(cls) -> bool:
    """Hugging Face ModelOutput: a dataclass that is also an OrderedDict of its non-None fields."""
    return isinstance(cls, type) and issubclass(cls, collections.OrderedDict) and dataclasses.is_dataclass(cls)


class ModelOutputVariable(VariableTracker):
    """A Hugging Face ModelOutput: made in the trace, or an existing one (``source``; read only)."""

    identity_attr = "value"
    METHODS = MethodTable()

    def __init__(self, cls, values: dict, source=None, value=None):
        self.cls = cls
        self.values = values  # field name -> VT, only non-None fields, in field order
        self.source = source
        self.value = value

    @staticmethod
    def create(tx, cls, args, kwargs):
        names = [f.name for f in dataclasses.fields(cls)]
        bound = dict(zip(names, args))
        bound.update(kwargs)
        vals = {}
        for n in names:
            v = bound.get(n)
            if v is None or (v.is_constant() and v.as_constant() is None):
                continue
            vals[n] = v
        return ModelOutputVariable(cls, vals)

    @staticmethod
    def existing(tx, value, source):
        """Items read as ``out['k']`` under a guard on the keys (the dict part is what the methods see)."""
        tx.output.guards.add(source, GuardKind.TYPE, type(value))
        tx.output.guards.add(source, GuardKind.DICT_KEYS, tuple(value.keys()))
        items = {k: VariableTracker.build(tx, v, ItemSource(source, k)) for k, v in value.items()}
        return ModelOutputVariable(type(value), items, source, value)

    def python_type(self):
        return self.cls

    def describe(self):
        return f"{self.cls.__name__}" + (f" at {self.source.name()}" if self.source is not None else "")

    def getattr(self, tx, name):
        names = [f.name for f in dataclasses.fields(self.cls)]
        if name in names and self.source is not None:  # the attribute, which may differ from the item
            return VariableTracker.build(tx, getattr(self.value, name), AttrSource(self.source, name))
        if name in self.values:
            return self.values[name]
        if name in names:
            return ConstantVariable(None)
        if name in ("to_tuple", "keys", "values", "items", "get", "__getitem__", "__contains__", "__len__"):
            return trackers.BoundMethodVariable(self, name)
        return class_attr_of_instance(tx, self, self.cls, name)

    def before_mutation(self, tx):
        if self.source is not None:
            raise Unsupported(f"changing {self.describe()}, a ModelOutput from outside the compiled function")

    def setattr(self, tx, name, value):
        self.before_mutation(tx)
        self.values[name] = value

    def unpack(self, tx):
        return [ConstantVariable(k) for k in self.values]

    def length(self, tx):
        return len(self.values)

    def truth(self, tx):
        return bool(self.values)

    @METHODS("to_tuple")
    def _to_tuple(self, tx, args, kwargs):
        return trackers.TupleVariable(list(self.values.values()))

    @METHODS("__getitem__")
    def _getitem(self, tx, args, kwargs):
        k = args[0].as_constant()
        if isinstance(k, str):
            return self.values[k]
        return trackers.TupleVariable(list(self.values.values())).getitem(tx, args[0])

    @METHODS("__setitem__", mutates=True)
    def _setitem(self, tx, args, kwargs):
        self.values[args[0].as_constant()] = args[1]
        return ConstantVariable(None)

    @METHODS("keys")
    def _keys(self, tx, args, kwargs):
        return trackers.DictViewVariable(trackers.DictVariable(self.values), "keys")

    @METHODS("values")
    def _values(self, tx, args, kwargs):
        return trackers.DictViewVariable(trackers.DictVariable(self.values), "values")

    @METHODS("items")
    def _items(self, tx, args, kwargs):
        return trackers.DictViewVariable(trackers.DictVariable(self.values), "items")

    @METHODS("get")
    def _get(self, tx, args, kwargs):
        return self.values.get(args[0].as_constant(), args[1] if len(args) > 1 else ConstantVariable(None))

    @METHODS("__contains__")
    def _contains(self, tx, args, kwargs):
        return ConstantVariable(args[0].as_constant() in self.values)

    @METHODS("__len__")
    def _len(self, tx, args, kwargs):
        return ConstantVariable(len(self.values))

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return cg.memo(self, lambda: f"{cg.const(self.cls, self.cls.__name__)}(" + ", ".join(
            f"{k}={cg.reconstruct(v)}" for k, v in self.values.items()) + ")")


@register_builder(collections.OrderedDict, kind="object")
def _build_model_output(tx, value, source):
    if source is None or not is_model_output_cls(type(value)):
        return None
    return ModelOutputVariable.existing(tx, value, source)
