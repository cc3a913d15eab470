"""Lazy iterators: ``map``, ``filter``, ``zip``, ``enumerate`` and the live iterator of a list.

Python pulls an iterator one item at a time, so a mapped function runs only when its item is
asked for: ``zip([a, b], map(f, xs))`` calls f twice, and ``lst.extend(map(g, ...))`` appends
each item before g runs on the next (g sees the list growing). These trackers keep that order: an
item is computed in ``next`` and nowhere else. Reconstructed (returned, or alive at a graph break)
they become the same lazy Python object over the reconstructed inner iterators, so what is left
runs at run time, in Python's order.
"""
from __future__ import annotations

import contextlib
import itertools

from ember.frontend.errors import TracedException, Unsupported
from ember.frontend import polyfills
from ember.frontend.variables.base import ConstantVariable, MethodTable, VariableTracker, helpers, trackers
from ember.frontend.variables.sequences import TupleVariable


class IteratorVariable(VariableTracker):
    """An iterator: ``next`` pulls one item (None when exhausted). Consumers pull item by item, as
    Python does."""

    METHODS = MethodTable()

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

    def method_missing(self, tx, name, args, kwargs):
        raise Unsupported(f"iterator.{name}()")

    @METHODS("__next__")
    def _next(self, tx, args, kwargs):
        item = self.next(tx)
        if item is None:
            raise TracedException(StopIteration, [], "next() on an exhausted iterator (StopIteration)")
        return item

    @METHODS("__iter__")
    def _iter(self, tx, args, kwargs):
        return self


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


@contextlib.contextmanager
def _stop_iteration_breaks(what: str):
    """Around a user callable an iterator calls to make its item: a StopIteration it raises ends
    the consumer's iteration in eager (the C iterator passes it on as its own); not modelled: a break."""
    try:
        yield
    except TracedException as exc:
        if issubclass(exc.exc_type, StopIteration):
            raise Unsupported(f"a StopIteration raised by the function of a {what} object") from None
        raise


def next_of(tx, it: VariableTracker):
    """The next item of an iterator tracker, or None when it is exhausted."""
    if isinstance(it, IteratorVariable):
        return it.next(tx)
    raise Unsupported(f"iterating over {it.describe()}")


@helpers.add
def iterate(tx, vt: VariableTracker):
    """Yield the items of an iterable tracker one at a time (what a consumer that interleaves its own
    effects with the pulls, such as ``list.extend``, must use instead of ``unpack``)."""
    if not isinstance(vt, IteratorVariable):
        yield from vt.unpack(tx)
        return
    while (item := vt.next(tx)) is not None:
        yield item


class MapIteratorVariable(IteratorVariable):
    def __init__(self, fn: VariableTracker, iters: list):
        super().__init__()
        self.fn = fn
        self.iters = iters

    def describe(self):
        return "map object"

    def next(self, tx):
        row = []
        for it in self.iters:  # map stops at the first exhausted iterator: later ones are not pulled
            item = next_of(tx, it)
            if item is None:
                return None
            row.append(item)
        with _stop_iteration_breaks("map"):
            return self.fn.call(tx, row, {})

    def reconstruct(self, cg):
        args = ", ".join(cg.reconstruct(v) for v in (self.fn, *self.iters))
        return cg.memo(self, lambda: f"map({args})")


class FilterIteratorVariable(IteratorVariable):
    def __init__(self, fn: VariableTracker, it: VariableTracker):
        super().__init__()
        self.fn = fn
        self.it = it

    def describe(self):
        return "filter object"

    def next(self, tx):
        while (item := next_of(tx, self.it)) is not None:
            if self.fn.is_constant() and self.fn.as_constant() is None:
                keep = item.truth(tx)
            else:
                with _stop_iteration_breaks("filter"):
                    keep = self.fn.call(tx, [item], {}).truth(tx)
            if keep:
                return item
        return None

    def reconstruct(self, cg):
        args = f"{cg.reconstruct(self.fn)}, {cg.reconstruct(self.it)}"
        return cg.memo(self, lambda: f"filter({args})")


class ZipIteratorVariable(IteratorVariable):
    def __init__(self, iters: list, strict: bool):
        super().__init__()
        self.iters = iters
        self.strict = strict
        self.done = False

    def describe(self):
        return "zip object"

    def next(self, tx):
        if self.done:
            return None
        row = []
        for i, it in enumerate(self.iters):
            item = next_of(tx, it)
            if item is None:
                self.done = True
                if self.strict and (i > 0 or any(next_of(tx, rest) is not None for rest in self.iters[1:])):
                    raise Unsupported("zip(strict=True) on iterables of different lengths (ValueError)")
                return None
            row.append(item)
        return TupleVariable(row)

    def reconstruct(self, cg):
        if self.done:
            return "iter(())"
        args = "".join(f"{cg.reconstruct(it)}, " for it in self.iters)
        return cg.memo(self, lambda: f"zip({args}strict={self.strict})")


class EnumerateIteratorVariable(IteratorVariable):
    def __init__(self, it: VariableTracker, start: int):
        super().__init__()
        self.it = it
        self.count = start

    def describe(self):
        return "enumerate object"

    def next(self, tx):
        item = next_of(tx, self.it)
        if item is None:
            return None
        pair = TupleVariable([ConstantVariable(self.count), item])
        self.count += 1
        return pair

    def reconstruct(self, cg):
        return cg.memo(self, lambda: f"enumerate({cg.reconstruct(self.it)}, {self.count})")


class ListLiveIteratorVariable(IteratorVariable):
    """``iter(lst)`` of a list (or deque) tracker: reads the list at each pull, like CPython's list
    iterator, so items appended while looping are visited and a shortened list ends the loop."""

    def __init__(self, seq: VariableTracker):
        super().__init__()
        self.seq = seq
        self.index = 0
        self.exhausted = False

    def next(self, tx):
        if self.exhausted or self.index >= len(self.seq.items):
            self.exhausted = True  # for good, as CPython's: appending later does not revive it
            return None
        item = self.seq.items[self.index]
        self.index += 1
        return item

    def reconstruct(self, cg):
        if self.exhausted:
            return "iter(())"
        seq = cg.reconstruct(self.seq)
        return cg.memo(self, lambda: f"{cg.const(_advanced, 'advanced_iter')}({seq}, {self.index})")


def _advanced(seq, n: int):
    """A live iterator over ``seq`` that has already yielded ``n`` items (the rebuilt state of one
    that was advanced while tracing)."""
    it = iter(seq)
    for _ in range(n):
        next(it)
    return it


class GeneratorVariable(IteratorVariable):
    """A generator made by calling a generator function in the trace: its frame runs up to the next
    ``yield`` each time the consumer pulls, so the generator's effects and the consumer's interleave
    as in Python. One that has not started is rebuilt at a graph break by calling the function
    again; a started one cannot be rebuilt (its frame is suspended inside the trace)."""

    def __init__(self, frame, fn_vt, args: list, kwargs: dict):
        super().__init__()
        self.frame = frame
        self.fn_vt = fn_vt
        self.args = args
        self.kwargs = kwargs
        self.started = False
        self.done = False
        self.original = None  # the C callable a polyfill generator stands for (rebuilt as a call of it)

    def describe(self):
        return f"generator {self.frame.code.co_name}"

    def next(self, tx):
        if self.done:
            return None
        self.started = True
        frame = self.frame
        frame.yielded = None
        try:
            frame.run()
        except TracedException as exc:
            self.done = True  # an exception leaving a generator finishes it
            if issubclass(exc.exc_type, StopIteration):  # PEP 479: a RuntimeError from it
                raise TracedException(RuntimeError, [VariableTracker.const("generator raised StopIteration")],
                                      "a StopIteration leaving a generator (RuntimeError)") from None
            raise
        except BaseException:
            self.done = True
            raise
        if frame.yielded is None:  # returned
            self.done = True
            return None
        item, frame.yielded = frame.yielded, None
        return item

    def call_method(self, tx, name, args, kwargs):
        if name in ("send", "throw", "close"):
            raise Unsupported(f"generator.{name}()")
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        if self.done:
            return "iter(())"
        if self.started:
            raise Unsupported(f"{self.describe()} suspended at a yield cannot cross a graph break or be returned")
        args = "".join(f"{cg.reconstruct(a)}, " for a in self.args)
        kw = "".join(f"{k}={cg.reconstruct(v)}, " for k, v in self.kwargs.items())
        fn = cg.const(self.original, self.original.__name__) if self.original is not None else cg.reconstruct(self.fn_vt)
        return cg.memo(self, lambda: f"{fn}({args}{kw})")


class DictIteratorVariable(IteratorVariable):
    """``iter(d)`` / ``iter(d.keys() | values() | items())``: walks the keys the dict had when the
    iterator was made, reading values at each pull. CPython raises RuntimeError when the dict changes
    size (or its keys) while iterated: that case breaks the graph, so eager Python raises it."""

    def __init__(self, d, kind: str):
        super().__init__()
        self.d = d
        self.kind = kind
        self.keys = list(d.items)
        self.index = 0

    def next(self, tx):
        if len(self.d.items) != len(self.keys) or any(k not in self.d.items for k in self.keys[self.index:]):
            raise Unsupported("a dict changed size or keys during iteration (RuntimeError)")
        if self.index >= len(self.keys):
            return None
        k = self.keys[self.index]
        self.index += 1
        if self.kind == "keys":
            return self.d.key_vt(k)
        if self.kind == "values":
            return self.d.items[k]
        return TupleVariable([self.d.key_vt(k), self.d.items[k]])

    def reconstruct(self, cg):
        src = cg.reconstruct(self.d) if self.kind == "keys" else f"{cg.reconstruct(self.d)}.{self.kind}()"
        return cg.memo(self, lambda: f"{cg.const(_advanced, 'advanced_iter')}({src}, {self.index})")


class ChainIteratorVariable(IteratorVariable):
    """``itertools.chain(*iterables)``: each iterable's iterator is taken when the chain reaches it."""

    def __init__(self, sources: list):
        super().__init__()
        self.sources = list(sources)
        self.active = None

    def describe(self):
        return "itertools.chain object"

    def next(self, tx):
        while True:
            if self.active is None:
                if not self.sources:
                    return None
                self.active = self.sources.pop(0).iter(tx)
            item = next_of(tx, self.active)
            if item is not None:
                return item
            self.active = None

    def reconstruct(self, cg):
        parts = ([self.active] if self.active is not None else []) + self.sources
        args = "".join(f"{cg.reconstruct(p)}, " for p in parts)
        return cg.memo(self, lambda: f"{cg.const(itertools.chain, 'chain')}({args})")


class IsliceIteratorVariable(IteratorVariable):
    """``itertools.islice``, pulling exactly what CPython's islice pulls (it skips up to the next
    index it yields, and never pulls past ``stop``)."""

    def __init__(self, it, start: int, stop: int | None, step: int):
        super().__init__()
        self.it = it
        self.next_index = start
        self.stop = stop
        self.step = step
        self.cnt = 0

    def describe(self):
        return "itertools.islice object"

    def next(self, tx):
        if self.it is None:
            return None
        while self.cnt < self.next_index:
            if next_of(tx, self.it) is None:
                self.it = None
                return None
            self.cnt += 1
        if self.stop is not None and self.cnt >= self.stop:
            self.it = None
            return None
        item = next_of(tx, self.it)
        if item is None:
            self.it = None
            return None
        self.cnt += 1
        self.next_index += self.step
        if self.stop is not None and self.next_index > self.stop:
            self.next_index = self.stop
        return item

    def reconstruct(self, cg):
        if self.it is None:
            return "iter(())"
        stop = None if self.stop is None else self.stop - self.cnt
        args = f"{cg.reconstruct(self.it)}, {self.next_index - self.cnt}, {stop}, {self.step}"
        return cg.memo(self, lambda: f"{cg.const(itertools.islice, 'islice')}({args})")


def make_itertool(tx, cls, args: list, kwargs: dict):
    """The lazy tracker of an ``itertools`` iterator ember models, or None."""
    if cls is itertools.chain and not kwargs:
        return ChainIteratorVariable(args)
    if cls is itertools.islice and not kwargs and 2 <= len(args) <= 4:
        bounds = [a.as_constant() for a in args[1:]]
        if any(b is not None and (type(b) is not int or b < 0) for b in bounds) or (len(bounds) == 3 and bounds[2] == 0):
            raise Unsupported(f"itertools.islice{tuple(bounds)} (ValueError)")
        start, stop, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds, 1)[:3]
        return IsliceIteratorVariable(args[0].iter(tx), start or 0, stop, step or 1)
    poly = polyfills.CLASSES.get(cls)
    if poly is not None:  # the rest: their documented Python equivalents, inlined as generators
        src = tx.output.object_source(poly, f"Python equivalent of itertools.{cls.__name__}")
        gen = trackers.UserFunctionVariable(poly, src).call(tx, args, kwargs)
        if isinstance(gen, GeneratorVariable):
            gen.original = cls  # returned unstarted, it is the itertools object again
        return gen
    return None
