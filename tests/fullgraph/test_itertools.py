"""``itertools`` objects inside the compiled function: traced through their documented Python
equivalents (ember/frontend/polyfills/iterators.py), lazily, as generators."""
import itertools
import operator

import pytest
import torch

from .harness import Cases, run, t

cases = Cases("itertools")


def three():
    return (t(3, grad=True), t(3, grad=True), t(3, grad=True))


@cases.case(three)
def chain_and_islice(a, b, c):
    out = [x * 2 for x in itertools.chain([a, b], (c,))]
    return out, list(itertools.islice([a, b, c, a], 1, 3)), list(itertools.chain.from_iterable([[a], [b, c]]))


@cases.case(three)
def product(a, b, c):
    out = [x * k for x, k in itertools.product([a, b], [1, 2, 3])]
    pairs = list(itertools.product("ab", repeat=2))
    return out, pairs


@cases.case(three)
def accumulate(a, b, c):
    sums = list(itertools.accumulate([a, b, c]))
    prods = list(itertools.accumulate([a, b, c], operator.mul))
    firsts = list(itertools.accumulate([1, 2, 3], lambda acc, v: acc * 10 + v, initial=7))
    return sums, prods, firsts, list(itertools.accumulate([]))


@cases.case(three)
def count(a, b, c):
    out = [x * k for x, k in zip([a, b, c], itertools.count(2, 3))]
    ctr = itertools.count()
    first = next(ctr)
    second = next(ctr)
    return out, first, second


@cases.case(three)
def zip_longest(a, b, c):
    pairs = [x if y is None else x * y for x, y in itertools.zip_longest([a, b, c], [2, 3])]
    filled = list(itertools.zip_longest("abc", [1], fillvalue=0))
    return pairs, filled


@cases.case(three)
def permutations_combinations(a, b, c):
    perms = [x - y for x, y in itertools.permutations([a, b, c], 2)]
    combs = [x * y for x, y in itertools.combinations([a, b, c], 2)]
    cwr = list(itertools.combinations_with_replacement([1, 2, 3], 2))
    return perms, combs, cwr, list(itertools.permutations("ab"))


@cases.case(three)
def groupby(a, b, c):
    tagged = [(0, a), (0, b), (1, c), (0, a)]
    sums = [(k, sum(x for _, x in g)) for k, g in itertools.groupby(tagged, key=lambda p: p[0])]
    plain = [(k, len(list(g))) for k, g in itertools.groupby("aabccc")]
    stale = [list(g) for _, g in list(itertools.groupby("aab"))]  # advanced groups are empty
    return sums, plain, stale


@cases.case(three)
def starmap_takewhile_pairwise(a, b, c):
    prods = list(itertools.starmap(torch.mul, [(a, b), (b, c)]))
    small = list(itertools.takewhile(lambda k: k < 3, [1, 2, 3, 1]))
    rest = list(itertools.dropwhile(lambda k: k < 3, [1, 2, 3, 1]))
    diffs = [y - x for x, y in itertools.pairwise([a, b, c])]
    picked = list(itertools.compress([a, b, c], [1, 0, 1]))
    return prods, small, rest, diffs, picked, list(itertools.filterfalse(None, [0, 1, 0, 2]))


@cases.case(three)
def repeat_lazy_effects(a, b, c):
    seen = []

    def f(x):
        seen.append(len(seen))
        return x + 1

    out = []
    for x in itertools.islice(map(f, itertools.repeat(a)), 3):
        out.append(x * len(seen))
    return out, seen


@pytest.mark.parametrize("c", cases, ids=cases.ids())
def test_case(c):
    run(c)


def test_unconsumed_iterator_returned_is_the_itertools_object():
    import ember

    def f(x):
        return x * 2, itertools.product([1, 2], "ab"), itertools.count(3)

    out, prod, cnt = ember.compile(f, fullgraph=True)(torch.ones(2))
    assert type(prod) is itertools.product and type(cnt) is itertools.count
    assert list(prod) == list(itertools.product([1, 2], "ab")) and next(cnt) == 3
