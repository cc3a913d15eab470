"""``dict.keys()`` / ``values()`` / ``items()``: live views of a dict tracker.

Python's rules: keys and items views are set-like (``==`` with any set-like compares as sets, ``&
| - ^`` give a ``set``, ``<=`` is a subset test); values views have no ``==`` of their own (two
are equal only when they are the same object). ``in`` on items looks the key up and compares the
value; every view sees later changes of its dict. Keys the trace cannot hash by value (objects
hashed by identity) stay out of set algebra: that breaks the graph instead of guessing.
"""
from __future__ import annotations

import operator

from ember.frontend.errors import Unsupported
from ember.frontend.variables.base import ConstantVariable, MethodTable, VariableTracker, helpers, trackers
from ember.frontend.variables.dicts import const_key
from ember.frontend.variables.iterators import ListIteratorVariable
from ember.frontend.variables.sequences import TupleVariable
from ember.frontend.variables.sets import SetVariable

_SET_OPS = {operator.and_: "&", operator.or_: "|", operator.sub: "-", operator.xor: "^"}
_ORDER = (operator.lt, operator.le, operator.gt, operator.ge)


class DictViewVariable(VariableTracker):
    METHODS = MethodTable()

    def __init__(self, d, kind: str):
        self.d = d
        self.kind = kind

    def python_type(self):
        return type(getattr({}, self.kind)())

    def describe(self):
        return f"dict_{self.kind}"

    def unpack(self, tx):
        if self.kind == "keys":
            return self.d.unpack(tx)
        if self.kind == "values":
            return list(self.d.items.values())
        return [TupleVariable([self.d.key_vt(k), v]) for k, v in self.d.items.items()]

    def length(self, tx):
        return len(self.d.items)

    def iter(self, tx):
        return trackers.DictIteratorVariable(self.d, self.kind)

    def truth(self, tx):
        return bool(self.d.items)

    def getattr(self, tx, name):
        if name == "mapping":
            raise Unsupported(f"dict_{self.kind}.mapping")
        if hasattr(self.python_type(), name):
            return trackers.BoundMethodVariable(self, name)
        raise AttributeError(f"'dict_{self.kind}' object has no attribute '{name}'")

    def method_missing(self, tx, name, args, kwargs):
        raise Unsupported(f"dict_{self.kind}.{name}()")

    @METHODS("__contains__")
    def _contains(self, tx, args, kwargs):
        return ConstantVariable(self.contains(tx, args[0]))

    @METHODS("__len__")
    def _len(self, tx, args, kwargs):
        return ConstantVariable(len(self.d.items))

    @METHODS("__iter__")
    def _iter(self, tx, args, kwargs):
        return self.iter(tx)

    @METHODS("__reversed__")
    def _reversed(self, tx, args, kwargs):
        return ListIteratorVariable(list(reversed(self.unpack(tx))))

    @METHODS("isdisjoint")
    def _isdisjoint(self, tx, args, kwargs):
        if self.kind == "values":
            return self.method_missing(tx, "isdisjoint", args, kwargs)
        return ConstantVariable(not (as_key_set(tx, self) & as_key_set(tx, args[0])))

    def contains(self, tx, item) -> bool:
        if self.kind == "keys":
            return const_key(tx, item) in self.d.items
        if self.kind == "values":
            return any(helpers.values_equal(tx, v, item) for v in self.d.items.values())
        if item.is_constant() and type(item.as_constant()) is tuple:
            item = TupleVariable(item.unpack(tx))
        if not isinstance(item, TupleVariable) or len(item.items) != 2:
            return False
        k = const_key(tx, item.items[0])
        return k in self.d.items and helpers.values_equal(tx, self.d.items[k], item.items[1])

    def reconstruct(self, cg) -> str:
        return f"{self.d.reconstruct(cg)}.{self.kind}()"


def is_set_like(v) -> bool:
    return isinstance(v, SetVariable) or isinstance(v, DictViewVariable) and v.kind != "values"


def as_key_set(tx, v) -> set:
    """The Python set a set-like tracker holds, for set algebra on constant members."""
    if isinstance(v, DictViewVariable) and v.kind == "keys":
        keys = [v.d.key_vt(k) for k in v.d.items]
    else:
        keys = v.unpack(tx)
    if not all(k.is_constant() for k in keys):
        raise Unsupported(f"set operations on {v.describe()} with members that are not constants")
    return {k.as_constant() for k in keys}


def view_operator(tx, fn, a, b):
    """``fn(a, b)`` where one side is a dict view; None when Python would not define it here."""
    views = [v for v in (a, b) if isinstance(v, DictViewVariable)]
    if fn in (operator.eq, operator.ne):
        if any(v.kind == "values" for v in views):  # no __eq__: identity
            same = helpers.identical(a, b)
        elif is_set_like(a) and is_set_like(b):
            same = _set_equal(tx, a, b)
        else:
            same = False
        return ConstantVariable(same if fn is operator.eq else not same)
    if fn in _SET_OPS and all(is_set_like(v) or _is_iterable(v) for v in (a, b)) \
            and not any(v.kind == "values" for v in views):
        return VariableTracker.const(fn(_as_set(tx, a), _as_set(tx, b)))
    if fn in _ORDER and is_set_like(a) and is_set_like(b):
        return ConstantVariable(fn(_as_set(tx, a), _as_set(tx, b)))
    return None


def _is_iterable(v) -> bool:
    return isinstance(v, (trackers.BaseSequenceVariable, trackers.DictVariable))


def _as_set(tx, v) -> set:
    if isinstance(v, DictViewVariable) and v.kind == "items":
        return {(k, _value_const(v.d.items[k])) for k in as_key_set(tx, DictViewVariable(v.d, "keys"))}
    if isinstance(v, (DictViewVariable, SetVariable)):
        return as_key_set(tx, v)
    return set(_value_const(i) for i in v.unpack(tx))


def _value_const(vt):
    if not vt.is_constant():
        raise Unsupported(f"set operations on dict items whose values are not constants ({vt.describe()})")
    return vt.as_constant()


def _set_equal(tx, a, b) -> bool:
    ia = isinstance(a, DictViewVariable) and a.kind == "items"
    ib = isinstance(b, DictViewVariable) and b.kind == "items"
    if ia and ib:  # equal key sets, and the values under each key compare equal
        ka, kb = set(a.d.items), set(b.d.items)
        return ka == kb and all(helpers.values_equal(tx, a.d.items[k], b.d.items[k]) for k in ka)
    if ia or ib:
        return _as_set(tx, a) == _as_set(tx, b)
    ka = set(a.d.items) if isinstance(a, DictViewVariable) else None
    kb = set(b.d.items) if isinstance(b, DictViewVariable) else None
    if ka is not None and kb is not None:  # keys hash by value or by the identity key the dict uses
        return ka == kb
    return as_key_set(tx, a) == as_key_set(tx, b)
