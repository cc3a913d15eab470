"""collections.deque made inside the trace: a list whose ``maxlen`` drops items from the other end."""
from __future__ import annotations

import collections

from ember.frontend.errors import Unsupported
from ember.frontend.variables.base import ConstantVariable, MethodTable
from ember.frontend.variables.sequences import ListVariable, pull


class DequeVariable(ListVariable):
    """collections.deque made inside the trace; with a ``maxlen``, adding to a full deque drops an
    item from the other end, as CPython does. List methods it shares come from ListVariable's table."""

    METHODS = MethodTable()

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

    @METHODS("append", mutates=True)
    def _append(self, tx, args, kwargs):
        self._add(args[0], left=False)
        return ConstantVariable(None)

    @METHODS("appendleft", mutates=True)
    def _appendleft(self, tx, args, kwargs):
        self._add(args[0], left=True)
        return ConstantVariable(None)

    @METHODS("extend", mutates=True)
    def _extend(self, tx, args, kwargs):
        return self._extend_side(tx, args[0], left=False)

    @METHODS("extendleft", mutates=True)
    def _extendleft(self, tx, args, kwargs):
        return self._extend_side(tx, args[0], left=True)

    def _extend_side(self, tx, iterable, left: bool):
        src = list(self.items) if iterable is self else iterable
        for v in pull(tx, src):  # one item at a time: a lazy source may read this deque
            self._add(v, left=left)
        return ConstantVariable(None)

    @METHODS("insert", mutates=True)
    def _insert(self, tx, args, kwargs):
        if self.maxlen is not None and len(self.items) >= self.maxlen:
            raise Unsupported("deque.insert() into a full deque (IndexError)")
        self.items.insert(args[0].as_constant(), args[1])
        return ConstantVariable(None)

    @METHODS("popleft", mutates=True)
    def _popleft(self, tx, args, kwargs):
        if not self.items:
            raise Unsupported("popleft from an empty deque (IndexError)")
        return self.items.pop(0)

    @METHODS("rotate", mutates=True)
    def _rotate(self, tx, args, kwargs):
        n = args[0].as_constant() if args else 1
        if self.items:
            n %= len(self.items)
            self.items[:] = self.items[-n:] + self.items[:-n]
        return ConstantVariable(None)

    @METHODS("copy", "__copy__")
    def _copy(self, tx, args, kwargs):
        return DequeVariable(list(self.items), maxlen=self.maxlen)

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return cg.load(self.source)
        maxlen = f", maxlen={self.maxlen}" if self.maxlen is not None else ""
        return cg.memo(self, lambda: f"{cg.const(collections.deque, 'deque')}(["
                       + ", ".join(cg.reconstruct(i) for i in self.items) + f"]{maxlen})")
