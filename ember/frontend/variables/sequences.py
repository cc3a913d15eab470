"""Tuples, lists, torch.Size, struct sequences, namedtuples and slices of variable trackers.

Their Python methods dispatch through per-class ``METHODS`` tables (see ``base.MethodTable``).
"""
from __future__ import annotations

import operator

import torch

from ember.frontend.errors import Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import AttrSource, ItemSource
from ember.frontend.variables.base import (
    ContainerMethods, CONST_TYPES, ConstantVariable, MethodTable, VariableTracker, guard, helpers,
    is_plain_namedtuple_cls, register_builder, trackers,
)


def pull(tx, iterable: VariableTracker):
    """The items of ``iterable`` one at a time (see ``iterators.iterate``)."""
    return helpers.iterate(tx, iterable)


class BaseSequenceVariable(ContainerMethods, VariableTracker):
    py_type: type = tuple
    METHODS = MethodTable()

    def __init__(self, items: list, source=None):
        self.items = list(items)
        self.source = source

    def python_type(self) -> type:
        return self.py_type

    def describe(self) -> str:
        return f"{self.py_type.__name__} of {len(self.items)}"

    def unpack(self, tx) -> list:
        return list(self.items)

    def length(self, tx) -> int:
        return len(self.items)

    def truth(self, tx) -> bool:
        return bool(self.items)

    def is_constant(self) -> bool:
        return all(i.is_constant() for i in self.items) and not self.is_symbolic()

    def is_symbolic(self) -> bool:
        return any(i.is_symbolic() for i in self.items)

    def as_constant(self):
        return self.py_type(i.as_constant() for i in self.items)

    def as_node_arg(self):
        return self.py_type(i.as_node_arg() for i in self.items)

    def as_fake_arg(self):
        return self.py_type(i.as_fake_arg() for i in self.items)

    def getitem(self, tx, key: VariableTracker) -> VariableTracker:
        k = key.as_index(tx)
        if isinstance(k, slice):
            return type(self)(self.items[k]) if type(self) in (TupleVariable, ListVariable) else TupleVariable(self.items[k])
        try:
            return self.items[operator.index(k)]
        except IndexError:
            raise Unsupported(f"index {k} out of range for {self.describe()} (IndexError)") from None

    @METHODS("index")
    def _index(self, tx, args, kwargs):
        for i, it in enumerate(self.items):
            if helpers.values_equal(tx, it, args[0]):
                return ConstantVariable(i)
        raise Unsupported("list.index(): value not found (ValueError)")

    @METHODS("count")
    def _count(self, tx, args, kwargs):
        return ConstantVariable(sum(1 for it in self.items if helpers.values_equal(tx, it, args[0])))

    @METHODS("__len__")
    def _len(self, tx, args, kwargs):
        return ConstantVariable(len(self.items))

    @METHODS("__contains__")
    def _contains(self, tx, args, kwargs):
        return helpers.contains(tx, self, args[0])

    @METHODS("__iter__")
    def _iter(self, tx, args, kwargs):
        return self.iter(tx)

    def getattr(self, tx, name):
        if hasattr(self.python_type(), name) or name in ("__getitem__", "__len__", "__contains__", "__iter__"):
            return trackers.BoundMethodVariable(self, name)
        raise AttributeError(f"'{self.py_type.__name__}' object has no attribute '{name}'")

class TupleVariable(BaseSequenceVariable):
    py_type = tuple

    def reconstruct(self, cg) -> str:
        if self.source is not None:  # tuples are immutable: the input object itself
            return cg.load(self.source)
        inner = ", ".join(cg.reconstruct(i) for i in self.items)
        return f"({inner},)" if len(self.items) == 1 else f"({inner})"


class SizeVariable(TupleVariable):
    """torch.Size built while tracing (e.g. from shapes and ints)."""

    def python_type(self):
        return torch.Size

    def as_constant(self):
        return torch.Size(i.as_constant() for i in self.items)

    def as_node_arg(self):
        return tuple(i.as_node_arg() for i in self.items)

    def as_fake_arg(self):
        return tuple(i.as_fake_arg() for i in self.items)

    def reconstruct(self, cg) -> str:
        return f"{cg.const(torch.Size, 'Size')}({super().reconstruct(cg)})"



class ListVariable(BaseSequenceVariable):
    py_type = list
    METHODS = MethodTable()

    def iter(self, tx):
        if type(self) is not ListVariable:  # a deque's iterator raises when the deque changes: snapshot
            return super().iter(tx)
        return trackers.ListLiveIteratorVariable(self)

    def before_mutation(self, tx):
        if self.source is not None:  # a list from outside: replay its final contents after the graph
            tx.output.side_effects.track_container(self)

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return cg.load(self.source)
        return cg.memo(self, lambda: "[" + ", ".join(cg.reconstruct(i) for i in self.items) + "]")

    def setitem(self, tx, key, value):
        self.before_mutation(tx)
        k = key.as_index(tx)
        if isinstance(k, slice):
            self.items[k] = value.unpack(tx)
        else:
            self.items[operator.index(k)] = value

    @METHODS("append", mutates=True)
    def _append(self, tx, args, kwargs):
        self.items.append(args[0])
        return ConstantVariable(None)

    @METHODS("extend", mutates=True)
    def _extend(self, tx, args, kwargs):
        if args[0] is self:  # extending a list by itself doubles it (CPython copies first)
            self.items.extend(list(self.items))
        for v in pull(tx, args[0]):  # one item at a time: a lazy source may read this list
            self.items.append(v)
        return ConstantVariable(None)

    @METHODS("pop", mutates=True)
    def _pop(self, tx, args, kwargs):
        return self.items.pop(args[0].as_constant() if args else -1)

    @METHODS("insert", mutates=True)
    def _insert(self, tx, args, kwargs):
        self.items.insert(args[0].as_constant(), args[1])
        return ConstantVariable(None)

    @METHODS("remove", mutates=True)
    def _remove(self, tx, args, kwargs):
        for i, it in enumerate(self.items):
            if helpers.values_equal(tx, it, args[0]):
                del self.items[i]
                return ConstantVariable(None)
        raise Unsupported("list.remove(): value not found (ValueError)")

    @METHODS("clear", mutates=True)
    def _clear(self, tx, args, kwargs):
        self.items.clear()
        return ConstantVariable(None)

    @METHODS("reverse", mutates=True)
    def _reverse(self, tx, args, kwargs):
        self.items.reverse()
        return ConstantVariable(None)

    @METHODS("copy")
    def _copy(self, tx, args, kwargs):
        return ListVariable(list(self.items))

    @METHODS("sort", mutates=True)
    def _sort(self, tx, args, kwargs):
        rev = kwargs["reverse"].as_constant() if "reverse" in kwargs else False
        self.items = helpers.sort_items(tx, self.items, kwargs.get("key"), rev)
        return ConstantVariable(None)

    @METHODS("__setitem__", mutates=True)
    def _setitem(self, tx, args, kwargs):
        self.setitem(tx, args[0], args[1])
        return ConstantVariable(None)

    @METHODS("__delitem__", mutates=True)
    def _delitem(self, tx, args, kwargs):
        del self.items[args[0].as_constant()]
        return ConstantVariable(None)


class StructSeqVariable(TupleVariable):
    """A torch.return_types struct sequence (values, indices, ...)."""

    def __init__(self, cls, items, source=None):
        super().__init__(items, source)
        self.cls = cls

    def python_type(self):
        return self.cls

    def getattr(self, tx, name):
        fields = getattr(self.cls, "__match_args__", ())
        if name in fields:
            return self.items[fields.index(name)]
        return super().getattr(tx, name)

    def reconstruct(self, cg) -> str:
        return f"{cg.const(self.cls, 'structseq')}({TupleVariable(self.items).reconstruct(cg)})"


class NamedTupleVariable(TupleVariable):
    METHODS = MethodTable()

    def __init__(self, cls, items, source=None, attrs: dict | None = None):
        super().__init__(items, source)
        self.cls = cls
        # instance attributes (a subclass without __slots__ has a __dict__): set in the trace, or
        # (an input) read from the object's __dict__, whose keys the builder guards
        self.attrs: dict = dict(attrs or {})

    def python_type(self):
        return self.cls

    def describe(self):
        return f"namedtuple {self.cls.__name__}"

    def getattr(self, tx, name):
        fields = self.cls._fields
        if name in self.attrs:
            return self.attrs[name]
        if name in fields:
            return self.items[fields.index(name)]
        if name in ("_replace", "_asdict", "index", "count", "__getitem__", "__len__", "__contains__"):
            return trackers.BoundMethodVariable(self, name)

        return helpers.class_attr_of_instance(tx, self, self.cls, name)

    def setattr(self, tx, name, value):
        if self.source is not None or "__dict__" not in dir(self.cls) \
                or helpers.python_dunder(self.cls, "__setattr__") \
                or name in self.cls._fields:
            # an input's attributes are side effects on an existing object; a plain namedtuple has
            # no __dict__ (AttributeError) and fields are read-only: Python decides, natively
            return super().setattr(tx, name, value)
        self.attrs[name] = value

    @METHODS("_asdict")
    def _asdict(self, tx, args, kwargs):
        return trackers.DictVariable({f: v for f, v in zip(self.cls._fields, self.items)})

    @METHODS("_replace")
    def _replace(self, tx, args, kwargs):
        new = list(self.items)
        for k, v in kwargs.items():
            new[self.cls._fields.index(k)] = v
        return NamedTupleVariable(self.cls, new)

    def reconstruct(self, cg) -> str:
        if self.source is not None:  # tuples are immutable: the input object itself
            return cg.load(self.source)
        built = f"{cg.const(self.cls, 'nt')}(" + ", ".join(cg.reconstruct(i) for i in self.items) + ")"
        if not self.attrs:
            return built
        attrs = "{" + ", ".join(f"{k!r}: {cg.reconstruct(v)}" for k, v in self.attrs.items()) + "}"
        return cg.memo(self, lambda: f"{cg.const(with_attrs, 'with_attrs')}({built}, {attrs})")


def with_attrs(obj, attrs: dict):
    """``obj`` after setting ``attrs`` on it: a rebuilt object that carries instance attributes."""
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj




class SliceVariable(VariableTracker):
    def __init__(self, start, stop, step):
        self.parts = (start, stop, step)

    def python_type(self):
        return slice

    def is_constant(self):
        return all(p.is_constant() for p in self.parts)

    def as_constant(self):
        return slice(*(p.as_constant() for p in self.parts))

    def as_node_arg(self):
        return slice(*(p.as_node_arg() for p in self.parts))

    def as_fake_arg(self):
        return slice(*(p.as_fake_arg() for p in self.parts))

    def getattr(self, tx, name):
        if name in ("start", "stop", "step"):
            return self.parts[("start", "stop", "step").index(name)]
        if name == "indices":
            return trackers.ConstantMethodVariable(self.as_constant(), "indices")
        raise AttributeError(name)

    def reconstruct(self, cg):
        return cg.const(self.as_constant())



# -- builder: tuples, lists and namedtuples, read from the frame (guarded) or made while tracing --

@register_builder(tuple, list)
def _build_sequence(tx, value, source):
    cls = type(value)
    if cls not in (tuple, list) and not is_plain_namedtuple_cls(cls):
        return None  # a user subclass (or a namedtuple with its own __getitem__, __len__...): a user object
    if source is None:
        if cls is tuple and all(isinstance(v, CONST_TYPES) for v in value):
            return ConstantVariable(value)
        items = [VariableTracker.const(v) for v in value]
    else:
        guard(tx, source, GuardKind.TYPE, cls)
        guard(tx, source, GuardKind.LEN, len(value))
        items = [VariableTracker.build(tx, v, ItemSource(source, i)) for i, v in enumerate(value)]
    if cls is list:
        return ListVariable(items, source)
    if cls is tuple:
        return TupleVariable(items, source)
    attrs = {}
    if source is not None and hasattr(value, "__dict__"):  # a subclass carrying instance attributes
        dsrc = AttrSource(source, "__dict__")
        guard(tx, dsrc, GuardKind.DICT_KEYS, tuple(vars(value)))
        attrs = {k: VariableTracker.build(tx, v, ItemSource(dsrc, k)) for k, v in vars(value).items()}
    return NamedTupleVariable(cls, items, source, attrs=attrs)

