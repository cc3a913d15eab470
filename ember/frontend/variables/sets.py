"""Sets and frozensets of variable trackers, iterated in the order CPython's own set would give.
Their methods dispatch through ``SetVariable.METHODS``."""
from __future__ import annotations

from ember.frontend.errors import Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.variables.base import (
    CONST_TYPES, ConstantVariable, MethodTable, VariableTracker, guard, helpers, register_builder, trackers,
)

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

    METHODS = MethodTable()

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

    def before_mutation(self, tx):
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
        if not hasattr(self.python_type(), name):  # frozenset has no add/discard/clear/...: eager raises
            raise AttributeError(f"'{self.python_type().__name__}' object has no attribute '{name}'")
        return trackers.BoundMethodVariable(self, name)

    @METHODS("add", mutates=True)
    def _add_method(self, tx, args, kwargs):
        self._add(args[0])
        return ConstantVariable(None)

    @METHODS("update", mutates=True)
    def _update(self, tx, args, kwargs):
        for a in args:
            real = a._order if isinstance(a, SetVariable) and a._exact else (
                a.as_constant() if a.is_constant() and isinstance(a.as_constant(), (set, frozenset)) else None)
            if real is not None:  # CPython merges another set's table at once: so does the real set
                self._own()
                self._order.update(real)
            for it in helpers.iterate(tx, a):
                self._add(it)
        return ConstantVariable(None)

    @METHODS("remove")
    def _remove(self, tx, args, kwargs):
        if self._key(args[0]) not in self.items:
            raise Unsupported("set.remove() of a missing element (KeyError)")
        return self._discard_method(tx, args, kwargs)

    @METHODS("discard")
    def _discard_method(self, tx, args, kwargs):
        self.before_mutation(tx)
        self._discard(self._key(args[0]))
        return ConstantVariable(None)

    @METHODS("clear", mutates=True)
    def _clear(self, tx, args, kwargs):
        self.items.clear()
        self._order, self._shared = set(), False
        self._real.clear()
        self._exact = True
        return ConstantVariable(None)

    @METHODS("__contains__")
    def _contains(self, tx, args, kwargs):
        return ConstantVariable(self._key(args[0]) in self.items)

    @METHODS("__len__")
    def _len(self, tx, args, kwargs):
        return ConstantVariable(len(self.items))

    @METHODS("copy")
    def _copy(self, tx, args, kwargs):
        return self.copy()

    def method_missing(self, tx, name, args, kwargs):
        if name in ("pop", "difference_update", "intersection_update", "symmetric_difference_update"):
            raise Unsupported(f"set.{name}()")
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


# -- builder: sets read from the frame (guarded) or made while tracing --

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
