"""Dicts keyed by tensors, read from the frame (an optimizer's ``state``, a defaultdict keyed by its
parameters): traced, where they were a graph break ("dict with non-constant keys").

A tensor hashes and compares as its identity in a dict: the keys are guarded to be the same objects in
the same order (``==`` would compare elements: two keys of equal value must not pass), each key is a
graph input reached by position, which is the same input as that tensor reached elsewhere.
"""
import collections
import copy

import pytest
import torch

import ember


def _world():
    torch.manual_seed(0)
    a, b, c = torch.randn(2), torch.randn(3), torch.tensor(1.0)
    return a, b, c, {a: torch.ones(2), b: torch.zeros(3), "s": 5}


def read(a, b, c, d):
    return d[a] + 1, d[b] * 2, d["s"]


def insert(a, b, c, d):
    d[c] = c * 3
    return d[a] * 2


def replace_value(a, b, c, d):
    d[a] = d[a] + 1
    return len(d)


def pop(a, b, c, d):
    return d.pop(b) if b in d else None


def iterate(a, b, c, d):
    return [k * 2 if isinstance(k, torch.Tensor) else k for k, v in d.items()]


def contains(a, b, c, d):
    return a in d, c in d, d.get(c, 7)


def mutate_value(a, b, c, d):
    d[a].add_(1)
    return d[a]


CASES = [read, insert, replace_value, pop, iterate, contains, mutate_value]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_tensor_keyed_dict_matches_eager(fn):
    runs = []
    for compiled in (False, True):
        a, b, c, d = _world()
        f = ember.compile(fn, backend="aot_eager") if compiled else fn
        out = [f(a, b, c, d) for _ in range(2)]
        keys = [{id(a): "a", id(b): "b", id(c): "c"}.get(id(k), k) for k in d]  # the keys, as the same objects
        runs.append((out, keys, list(d.values())))
    assert _same(runs[0], runs[1]), runs
    a, b, c, d = _world()
    report = ember.explain(fn, backend="aot_eager")(a, b, c, d)
    assert report.graph_break_count == 0 and not report.fallbacks, (report.break_reasons, report.fallbacks)


def test_keys_of_equal_value_are_other_keys():
    def f(d):
        return [v * 2 for v in d.values()]

    cf = ember.compile(f, backend="aot_eager")
    d1 = {torch.tensor(1.0): torch.ones(2)}
    d2 = {torch.tensor(1.0): torch.full((2,), 3.0)}  # an equal key, another object
    assert _same(cf(d1), f(d1)) and _same(cf(d2), f(d2))
    assert cf._ember_cache.compile_count == 2
    assert "not the same objects" in cf._ember_cache.recompile_reasons[-1]


def test_optimizer_like_state_defaultdict():
    def step(params, state):
        for p in params:
            st = state[p]
            if "buf" not in st:
                st["buf"] = torch.zeros_like(p)
            st["buf"].add_(p)
            with torch.no_grad():
                p.add_(st["buf"], alpha=-0.1)

    m = torch.nn.Linear(3, 2)
    m2 = copy.deepcopy(m)
    state, state2 = collections.defaultdict(dict), collections.defaultdict(dict)
    cs = ember.compile(step, backend="aot_eager")
    for _ in range(3):
        step(list(m.parameters()), state)
        cs(list(m2.parameters()), state2)
    for p, q in zip(m.parameters(), m2.parameters()):
        assert torch.equal(p, q) and torch.equal(state[p]["buf"], state2[q]["buf"])
    assert list(state2) == list(m2.parameters())  # keyed by the parameters themselves
    report = ember.explain(step, backend="aot_eager")(list(m2.parameters()), state2)
    assert report.graph_break_count == 0 and not report.fallbacks, (report.break_reasons, report.fallbacks)
