"""``itertools`` iterators as generator functions (the equivalents in the itertools documentation).

Traced, a call makes a generator tracker whose frame runs up to the next ``yield`` at each pull,
so item order, laziness and the interleaving with the consumer's effects match the C iterators.
Differences from the C objects, none visible to values: ``type()`` is a generator, and a generator
started in the trace cannot be returned from the compiled function or cross a graph break (that is
reported as a break, never a wrong result). ``next(it, _DONE)`` replaces ``try: next(it) except
StopIteration`` (the frontend breaks on a StopIteration escaping ``next``).
"""
import itertools

_DONE = object()  # a private sentinel: no item of any iterable can be it


def count(start=0, step=1):
    n = start
    while True:
        yield n
        n += step


def repeat(object, times=None):  # noqa: A002 - itertools' own parameter name
    if times is None:
        while True:
            yield object
    else:
        for _ in range(times):
            yield object


def accumulate(iterable, func=None, *, initial=None):
    it = iter(iterable)
    total = initial
    if initial is None:
        total = next(it, _DONE)
        if total is _DONE:
            return
    yield total
    for element in it:
        total = total + element if func is None else func(total, element)
        yield total


def product(*iterables, repeat=1):
    if repeat < 0:
        raise ValueError("repeat argument cannot be negative")
    pools = [tuple(pool) for pool in iterables] * repeat
    result = [[]]
    for pool in pools:
        result = [x + [y] for x in result for y in pool]
    for prod in result:
        yield tuple(prod)


def permutations(iterable, r=None):
    pool = tuple(iterable)
    n = len(pool)
    r = n if r is None else r
    if r > n:
        return
    indices = list(range(n))
    cycles = list(range(n, n - r, -1))
    yield tuple(pool[i] for i in indices[:r])
    while n:
        for i in reversed(range(r)):
            cycles[i] -= 1
            if cycles[i] == 0:
                indices[i:] = indices[i + 1:] + indices[i:i + 1]
                cycles[i] = n - i
            else:
                j = cycles[i]
                indices[i], indices[-j] = indices[-j], indices[i]
                yield tuple(pool[i] for i in indices[:r])
                break
        else:
            return


def combinations(iterable, r):
    pool = tuple(iterable)
    n = len(pool)
    if r > n:
        return
    indices = list(range(r))
    yield tuple(pool[i] for i in indices)
    while True:
        for i in reversed(range(r)):
            if indices[i] != i + n - r:
                break
        else:
            return
        indices[i] += 1
        for j in range(i + 1, r):
            indices[j] = indices[j - 1] + 1
        yield tuple(pool[i] for i in indices)


def combinations_with_replacement(iterable, r):
    pool = tuple(iterable)
    n = len(pool)
    if not n and r:
        return
    indices = [0] * r
    yield tuple(pool[i] for i in indices)
    while True:
        for i in reversed(range(r)):
            if indices[i] != n - 1:
                break
        else:
            return
        indices[i:] = [indices[i] + 1] * (r - i)
        yield tuple(pool[i] for i in indices)


def zip_longest(*iterables, fillvalue=None):
    iterators = [iter(it) for it in iterables]
    num_active = len(iterators)
    if not num_active:
        return
    while True:
        values = []
        for i, it in enumerate(iterators):
            value = next(it, _DONE)
            if value is _DONE:
                num_active -= 1
                if not num_active:
                    return
                iterators[i] = repeat(fillvalue)
                value = fillvalue
            values.append(value)
        yield tuple(values)


class _GroupbyState:
    """What the groupby generator and its group generators share (CPython's groupby object)."""

    def __init__(self, iterable, key):
        self.it = iter(iterable)
        self.key = key
        self.exhausted = False
        self.value = _DONE
        self.current = _DONE
        self.group = 0  # which group is current: an older group's iterator yields nothing more

    def advance(self):
        self.value = next(self.it, _DONE)
        if self.value is _DONE:
            self.exhausted = True
            return False
        self.current = self.value if self.key is None else self.key(self.value)
        return True


def _grouper(state, target, number):
    if state.group != number:
        return
    yield state.value
    while state.group == number and state.advance():
        if not (target == state.current):
            return
        yield state.value


def groupby(iterable, key=None):
    state = _GroupbyState(iterable, key)
    if not state.advance():
        return
    while not state.exhausted:
        target = state.current
        yield target, _grouper(state, target, state.group)
        # skip what the consumer left of this group (the C groupby does the same on the next pull)
        while not state.exhausted and target == state.current:
            state.advance()
        state.group += 1


def starmap(function, iterable):
    for args in iterable:
        yield function(*args)


def takewhile(predicate, iterable):
    for x in iterable:
        if not predicate(x):
            return
        yield x


def dropwhile(predicate, iterable):
    it = iter(iterable)
    for x in it:
        if not predicate(x):
            yield x
            break
    for x in it:
        yield x


def filterfalse(predicate, iterable):
    for x in iterable:
        if not (x if predicate is None else predicate(x)):
            yield x


def compress(data, selectors):
    for d, s in zip(data, selectors):
        if s:
            yield d


def pairwise(iterable):
    it = iter(iterable)
    a = next(it, _DONE)
    if a is _DONE:
        return
    for b in it:
        yield a, b
        a = b


POLYFILLS = {
    itertools.count: count, itertools.repeat: repeat, itertools.accumulate: accumulate,
    itertools.product: product, itertools.permutations: permutations, itertools.combinations: combinations,
    itertools.combinations_with_replacement: combinations_with_replacement, itertools.zip_longest: zip_longest,
    itertools.groupby: groupby, itertools.starmap: starmap, itertools.takewhile: takewhile,
    itertools.dropwhile: dropwhile, itertools.filterfalse: filterfalse, itertools.compress: compress,
    itertools.pairwise: pairwise,
}
