"""Tuples, lists, dicts, sets, slices and iterators of variable trackers."""
from __future__ import annotations

import collections
import enum
import operator
import types

import torch

from ember.frontend.errors import TracedException, Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import AttrSource, ItemSource
from ember.frontend.variables.base import (
    CONST_TYPES, ConstantVariable, VariableTracker, guard, helpers, is_namedtuple_cls, register_builder, trackers,
)


def _pull(tx, iterable: VariableTracker):
    """The items of ``iterable`` one at a time (see ``iterators.iterate``)."""
    return helpers.iterate(tx, iterable)


def _const_key(tx, k: VariableTracker):
    if k.is_constant():
        return k.as_constant()

    return helpers.hashable_key(k)


class BaseSequenceVariable(VariableTracker):
    py_type: type = tuple

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
        k = key.as_constant()
        if isinstance(k, slice):
            return type(self)(self.items[k]) if type(self) in (TupleVariable, ListVariable) else TupleVariable(self.items[k])
        try:
            return self.items[operator.index(k)]
        except IndexError:
            raise Unsupported(f"index {k} out of range for {self.describe()} (IndexError)") from None

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "index":
            for i, it in enumerate(self.items):
                if helpers.values_equal(tx, it, args[0]):
                    return ConstantVariable(i)
            raise Unsupported("list.index(): value not found (ValueError)")
        if name == "count":
            return ConstantVariable(sum(1 for it in self.items if helpers.values_equal(tx, it, args[0])))
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "__contains__":
            return helpers.contains(tx, self, args[0])
        if name == "__iter__":
            return self.iter(tx)
        raise Unsupported(f"{self.py_type.__name__}.{name}()")

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
        return f"{cg.const(__import__('torch').Size, 'Size')}({super().reconstruct(cg)})"


class ListVariable(BaseSequenceVariable):
    py_type = list

    def iter(self, tx):
        if type(self) is not ListVariable:  # a deque's iterator raises when the deque changes: snapshot
            return super().iter(tx)

        return trackers.ListLiveIteratorVariable(self)

    def _check_mutable(self, tx, what: str):
        if self.source is not None:  # a list from outside: replay its final contents after the graph
            tx.output.side_effects.track_container(self)

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return cg.load(self.source)
        return cg.memo(self, lambda: "[" + ", ".join(cg.reconstruct(i) for i in self.items) + "]")

    def setitem(self, tx, key, value):
        self._check_mutable(tx, "item assignment")
        k = key.as_constant()
        if isinstance(k, slice):
            self.items[k] = value.unpack(tx)
        else:
            self.items[operator.index(k)] = value

    def call_method(self, tx, name, args, kwargs):
        items = self.items
        if name in ("append", "extend", "pop", "insert", "remove", "clear", "reverse", "sort", "__setitem__", "__delitem__"):
            self._check_mutable(tx, f"list.{name}()")
        if name == "append":
            items.append(args[0])
        elif name == "extend":
            if args[0] is self:  # extending a list by itself doubles it (CPython copies first)
                items.extend(list(items))
            for v in _pull(tx, args[0]):  # one item at a time: a lazy source may read this list
                self.items.append(v)
        elif name == "pop":
            idx = args[0].as_constant() if args else -1
            return items.pop(idx)
        elif name == "insert":
            items.insert(args[0].as_constant(), args[1])
        elif name == "remove":
            for i, it in enumerate(items):
                if helpers.values_equal(tx, it, args[0]):
                    del items[i]
                    break
            else:
                raise Unsupported("list.remove(): value not found (ValueError)")
        elif name == "clear":
            items.clear()
        elif name == "reverse":
            items.reverse()
        elif name == "copy":
            return ListVariable(list(items))
        elif name == "sort":
            key = kwargs.get("key")
            rev = kwargs["reverse"].as_constant() if "reverse" in kwargs else False

            self.items = helpers.sort_items(tx, items, key, rev)
        elif name == "__setitem__":
            self.setitem(tx, args[0], args[1])
        elif name == "__delitem__":
            del items[args[0].as_constant()]
        else:
            return super().call_method(tx, name, args, kwargs)
        return ConstantVariable(None)


class DequeVariable(ListVariable):
    """collections.deque made inside the trace; with a ``maxlen``, adding to a full deque drops an
    item from the other end, as CPython does."""

    def __init__(self, items: list, source=None, maxlen: int | None = None):
        super().__init__(items if maxlen is None else list(items)[-maxlen:] if maxlen else [], source)
        self.maxlen = maxlen

    def python_type(self):
        return collections.deque

    def describe(self):
        return f"deque of {len(self.items)}"

    def getattr(self, tx, name):
        if name == "maxlen":
            return ConstantVariable(self.maxlen)
        return super().getattr(tx, name)

    def _add(self, v, left: bool):
        if self.maxlen == 0:
            return
        if self.maxlen is not None and len(self.items) >= self.maxlen:
            self.items.pop(-1 if left else 0)
        self.items.insert(0, v) if left else self.items.append(v)

    def call_method(self, tx, name, args, kwargs):
        if name in ("append", "appendleft", "extend", "extendleft", "insert", "pop", "popleft", "remove",
                    "clear", "rotate", "reverse"):
            self._check_mutable(tx, f"deque.{name}()")
        if name in ("append", "appendleft"):
            self._add(args[0], left=name == "appendleft")
        elif name in ("extend", "extendleft"):
            src = list(self.items) if args[0] is self else args[0]
            for v in _pull(tx, src):  # one item at a time: a lazy source may read this deque
                self._add(v, left=name == "extendleft")
        elif name == "insert":
            if self.maxlen is not None and len(self.items) >= self.maxlen:
                raise Unsupported("deque.insert() into a full deque (IndexError)")
            self.items.insert(args[0].as_constant(), args[1])
        elif name == "popleft":
            if not self.items:
                raise Unsupported("popleft from an empty deque (IndexError)")
            return self.items.pop(0)
        elif name == "rotate":
            n = args[0].as_constant() if args else 1
            if self.items:
                n %= len(self.items)
                self.items[:] = self.items[-n:] + self.items[:-n]
        elif name in ("copy", "__copy__"):
            return DequeVariable(list(self.items), maxlen=self.maxlen)
        else:
            return super().call_method(tx, name, args, kwargs)
        return ConstantVariable(None)

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return cg.load(self.source)
        maxlen = f", maxlen={self.maxlen}" if self.maxlen is not None else ""
        return cg.memo(self, lambda: f"{cg.const(collections.deque, 'deque')}([" + ", ".join(cg.reconstruct(i) for i in self.items) + f"]{maxlen})")


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

    def call_method(self, tx, name, args, kwargs):
        if name == "_asdict":
            return DictVariable({f: v for f, v in zip(self.cls._fields, self.items)})
        if name == "_replace":
            new = list(self.items)
            for k, v in kwargs.items():
                new[self.cls._fields.index(k)] = v
            return NamedTupleVariable(self.cls, new)
        return super().call_method(tx, name, args, kwargs)

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


class DictVariable(VariableTracker):
    """A dict with constant keys. ``items`` maps the Python key to (key VT, value VT)."""

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

    def _check_mutable(self, tx, what):
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
        k = _const_key(tx, key)
        if k not in self.items:
            if self.default_factory is not None:
                self.setitem(tx, key, self.default_factory.call(tx, [], {}))
                return self.items[k]
            if self.py_type.__name__ == "Counter" and self.py_type.__module__ == "collections":
                return ConstantVariable(0)  # Counter.__missing__: 0, without inserting
            raise TracedException(KeyError, [key], f"dict key {k!r} not found (KeyError)")
        return self.items[k]

    def setitem(self, tx, key, value):
        self._check_mutable(tx, "item assignment")
        k = _const_key(tx, key)
        self.items[k] = value
        if not key.is_constant():
            self.key_vts[k] = key

    def getattr(self, tx, name):
        if name == "default_factory" and self.default_factory is not None:
            return self.default_factory
        if hasattr(self.py_type, name):
            return trackers.BoundMethodVariable(self, name)
        raise AttributeError(f"'{self.py_type.__name__}' object has no attribute '{name}'")

    def call_method(self, tx, name, args, kwargs):
        items = self.items
        if name in ("update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__", "move_to_end"):
            self._check_mutable(tx, f"dict.{name}()")
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "get":
            k = _const_key(tx, args[0])
            return items[k] if k in items else (args[1] if len(args) > 1 else ConstantVariable(None))
        if name in ("keys", "values", "items"):
            return trackers.DictViewVariable(self, name)
        if name == "__contains__":
            return ConstantVariable(_const_key(tx, args[0]) in items)
        if name == "__len__":
            return ConstantVariable(len(items))
        if name == "__iter__":
            return self.iter(tx)
        if name == "copy":  # a defaultdict's copy keeps its factory
            return DictVariable(items, py_type=self.py_type, key_vts=self.key_vts, default_factory=self.default_factory)
        if name == "update":
            if args:
                for k, v in helpers.dict_items_of(tx, args[0]):
                    self.setitem(tx, k, v)
            for k, v in kwargs.items():
                items[k] = v
            return ConstantVariable(None)
        if name == "setdefault":
            k = _const_key(tx, args[0])
            if k not in items:
                self.setitem(tx, args[0], args[1] if len(args) > 1 else ConstantVariable(None))
            return items[k]
        if name == "pop":
            k = _const_key(tx, args[0])
            if k in items:
                self.key_vts.pop(k, None)
                return items.pop(k)
            if len(args) > 1:
                return args[1]
            raise TracedException(KeyError, [args[0]], f"dict.pop(): key {k!r} not found (KeyError)")
        if name == "__setitem__":
            self.setitem(tx, args[0], args[1])
            return ConstantVariable(None)
        if name == "__delitem__":
            del items[_const_key(tx, args[0])]
            return ConstantVariable(None)
        if name == "clear":
            items.clear()
            return ConstantVariable(None)
        if name == "move_to_end":
            k = _const_key(tx, args[0])
            last = (args[1] if len(args) > 1 else kwargs.get("last", ConstantVariable(True))).as_constant()
            v = items.pop(k)
            self.items = {k: v, **items} if not last else {**items, k: v}
            return ConstantVariable(None)
        raise Unsupported(f"{self.py_type.__name__}.{name}()")

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return cg.load(self.source)

        def build():
            body = self.items_literal(cg)
            if self.py_type is dict:
                return body
            if self.default_factory is not None:
                return f"{cg.const(self.py_type, 'dict_type')}({cg.reconstruct(self.default_factory)}, {body})"
            return f"{cg.const(self.py_type, 'dict_type')}({body})"

        return cg.memo(self, build)


    def items_literal(self, cg) -> str:
        return "{" + ", ".join(f"{cg.reconstruct(self.key_vt(k))}: {cg.reconstruct(v)}" for k, v in self.items.items()) + "}"


_UNKNOWN = object()


def _real_member(vt):
    """The Python object a set member hashes as, when it is known while tracing (constants, existing
    objects); _UNKNOWN for objects made in the trace and tensors (hashed by their run-time id)."""
    if vt.is_constant():
        return vt.as_constant()

    k = helpers.hashable_key(vt)
    if isinstance(k, VariableTracker) or isinstance(k, tuple) or type(k).__module__.startswith("torch.fx"):
        return _UNKNOWN
    return k


class SetVariable(VariableTracker):
    """A set of constants, or of objects hashed by identity (modules, classes, functions)."""

    def __init__(self, items, frozen=False, source=None):
        self.items = {}  # key -> VT, insertion ordered
        self.frozen = frozen
        self.source = source  # a set that exists outside the function: mutations are side effects
        # CPython iterates a set in hash-table order, which depends on the hashes and on the history
        # of adds and removals: a real set fed the same operations gives that order (``_real`` maps
        # its members back to keys). Members whose hash is only known at run time (objects made in
        # the trace, tensors) make the order unknown: iterating then breaks the graph.
        self._order: set = set()
        self._real: dict = {}  # key -> the real member in _order
        self._exact = True
        self._shared = False  # _order is a real set of the program (copied before the first change)
        for it in items:
            self._add(it)

    @staticmethod
    def of_real(value, items: list, source=None) -> "SetVariable":
        """The tracker of a real set (an input or a constant): it iterates in that set's own order."""
        vt = SetVariable(items, frozen=isinstance(value, frozenset), source=source)
        if vt._exact:
            vt._order, vt._shared = value, True
        return vt

    def _own(self):
        if self._shared:
            self._order, self._shared = set(self._order), False

    def _add(self, vt):
        key = self._key(vt)
        if key in self.items:
            return
        self.items[key] = vt
        self._own()
        real = _real_member(vt)
        if real is _UNKNOWN:
            self._exact = False
        else:
            self._order.add(real)
            self._real[key] = real

    def copy(self) -> "SetVariable":
        """set.copy(): the same members; the real set is copied too (CPython copies the table)."""
        new = SetVariable([], self.frozen)
        new.items, new._real, new._exact = dict(self.items), dict(self._real), self._exact
        new._order = set(self._order) if self._shared else self._order.copy()
        return new

    def _discard(self, key):
        self._own()
        if self.items.pop(key, None) is not None and key in self._real:
            self._order.discard(self._real.pop(key))

    def _mutated(self, tx):
        if self.source is not None:
            tx.output.side_effects.track_container(self)

    @staticmethod
    def _key(vt):
        if vt.is_constant():
            return ("c", vt.as_constant())

        k = helpers.hashable_key(vt)
        return ("tuple", k) if isinstance(k, tuple) else ("id", id(k))  # tuples hash by their items

    def python_type(self):
        return frozenset if self.frozen else set

    def is_constant(self):
        return all(k[0] == "c" for k in self.items)

    def as_constant(self):
        if not self.is_constant():
            raise Unsupported("a set of objects used as a constant")
        return (frozenset if self.frozen else set)(self._order)  # a copy of the real set: CPython's order

    def unpack(self, tx):
        if len(self.items) <= 1:
            return list(self.items.values())
        if not self._exact:
            raise Unsupported("iterating a set holding objects made in the trace or tensors: CPython's order "
                              "follows their run-time hashes", hint="iterate a list instead")
        key_of = {id(r): k for k, r in self._real.items()}
        return [self.items[key_of[id(r)]] for r in self._order]

    def length(self, tx):
        return len(self.items)

    def truth(self, tx):
        return bool(self.items)

    def getattr(self, tx, name):
        return trackers.BoundMethodVariable(self, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "add":
            self._mutated(tx)
            self._add(args[0])
            return ConstantVariable(None)
        if name == "update":
            self._mutated(tx)
            for a in args:
                real = a._order if isinstance(a, SetVariable) and a._exact else (
                    a.as_constant() if a.is_constant() and isinstance(a.as_constant(), (set, frozenset)) else None)
                if real is not None:  # CPython merges another set's table at once: so does the real set
                    self._own()
                    self._order.update(real)
                for it in _pull(tx, a):
                    self._add(it)
            return ConstantVariable(None)
        if name == "remove" and self._key(args[0]) not in self.items:
            raise Unsupported("set.remove() of a missing element (KeyError)")
        if name in ("discard", "remove"):
            self._mutated(tx)
            self._discard(self._key(args[0]))
            return ConstantVariable(None)
        if name == "clear":
            self._mutated(tx)
            self.items.clear()
            self._order, self._shared = set(), False
            self._real.clear()
            self._exact = True
            return ConstantVariable(None)
        if name in ("pop", "difference_update", "intersection_update", "symmetric_difference_update"):
            raise Unsupported(f"set.{name}()")
        if name == "__contains__":
            return ConstantVariable(self._key(args[0]) in self.items)
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "copy":
            return self.copy()
        # everything else (union, intersection, issubset, ...) on constant values
        res = getattr(self.as_constant(), name)(*[a.as_constant() for a in args])

        return VariableTracker.const(res)

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        if self.frozen and self.is_constant():
            return cg.const(self.as_constant())
        # a new set on every call: a shared constant would be mutated by the caller (set.add...)
        members = self.unpack(None) if self._exact else list(self.items.values())
        items = ", ".join(cg.reconstruct(v) for v in members)
        built = f"{{{items}}}" if items else "set()"
        return f"frozenset({built})" if self.frozen else built

    def items_literal(self, cg) -> str:
        return "(" + "".join(f"{cg.reconstruct(v)}, " for v in self.items.values()) + ")"


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


class IteratorVariable(VariableTracker):
    """An iterator: ``next`` pulls one item (None when exhausted). Consumers pull item by item, as
    Python does; the lazy ones (map, filter, zip...) live in ``iterators.py``."""

    def __init__(self):
        pass

    def describe(self):
        return "iterator"

    def next(self, tx):
        raise NotImplementedError

    def unpack(self, tx):
        out = []
        while (item := self.next(tx)) is not None:
            out.append(item)
        return out

    def iter(self, tx):
        return self

    def truth(self, tx):
        return True

    def call_method(self, tx, name, args, kwargs):
        if name == "__next__":
            item = self.next(tx)
            if item is None:
                raise Unsupported("next() on an exhausted iterator (StopIteration)")
            return item
        if name == "__iter__":
            return self
        raise Unsupported(f"iterator.{name}()")


class ListIteratorVariable(IteratorVariable):
    """An iterator over a known list of items; advancing it is tracked here, not replayed."""

    def __init__(self, items: list, index: int = 0):
        self.items = items
        self.index = index

    def next(self, tx):
        if self.index >= len(self.items):
            return None
        item = self.items[self.index]
        self.index += 1
        return item

    def unpack(self, tx):
        rest = self.items[self.index:]
        self.index = len(self.items)
        return rest

    def reconstruct(self, cg):
        return f"iter({TupleVariable(self.items[self.index:]).reconstruct(cg)})"


# -- builders: tuples, lists, dicts and sets, read from the frame (guarded) or made while tracing --

def _is_identity_key(k) -> bool:
    """A dict key that hashes and compares by identity and is fixed once the dict's keys are guarded:
    classes, functions, typing's special forms (e.g. a table of validators keyed by type)."""
    return isinstance(k, (type, types.FunctionType, types.BuiltinFunctionType)) or type(k).__module__ == "typing"


@register_builder(tuple, list)
def _build_sequence(tx, value, source):
    cls = type(value)
    if cls not in (tuple, list) and not is_namedtuple_cls(cls):
        return None  # a user subclass: a user object
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
    if not all(isinstance(k, (int, str, float, bool, type(None), enum.Enum, tuple)) or _is_identity_key(k)
               for k in keys):
        raise Unsupported(f"dict with non-constant keys at {source.name()}")
    guard(tx, source, GuardKind.DICT_KEYS, tuple(keys))
    items = {k: VariableTracker.build(tx, value[k], ItemSource(source, k)) for k in keys}
    key_vts = {k: VariableTracker.build_object(tx, k) for k in keys if _is_identity_key(k)}
    factory = getattr(value, "default_factory", None)  # a defaultdict's: a missing key calls it
    factory = VariableTracker.build(tx, factory, AttrSource(source, "default_factory")) if factory is not None else None
    return DictVariable(items, source, py_type=type(value), key_vts=key_vts, default_factory=factory)


@register_builder(set, frozenset)
def _build_set(tx, value, source):
    if source is None:
        return SetVariable.of_real(value, [VariableTracker.const(v) for v in value])
    if type(value) not in (set, frozenset):
        return None
    if not all(isinstance(v, CONST_TYPES) for v in value):
        raise Unsupported(f"set of non-constants at {source.name()}")
    guard(tx, source, GuardKind.CONST, type(value)(value))
    return SetVariable.of_real(value, [ConstantVariable(v) for v in value],
                               source=source if type(value) is set else None)
