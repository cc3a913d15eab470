"""A dict that changes size while it is iterated raises RuntimeError in Python: the trace must not
walk a snapshot of its keys silently; it breaks the graph so that eager Python raises."""
import pytest
import torch

import ember


def grow_while_iterating(x):
    d = {"a": x}
    for k in d:
        d[k + "x"] = x
    return d


def grow_while_iterating_values(x):
    d = {"a": x, "b": x}
    out = x
    for v in d.values():
        out = out + v
        d.pop("b", None)
    return out


@pytest.mark.parametrize("fn", [grow_while_iterating, grow_while_iterating_values])
def test_mutation_during_iteration_raises_like_eager(fn):
    with pytest.raises(RuntimeError, match="changed size"):
        fn(torch.ones(2))
    with pytest.raises(RuntimeError, match="changed size"):
        ember.compile(fn)(torch.ones(2))
    with pytest.raises(ember.CompileError, match="changed size or keys during iteration"):
        ember.compile(fn, fullgraph=True)(torch.ones(2))


def test_changing_values_while_iterating_is_fine():
    def fn(x):
        d = {"a": x, "b": x * 2}
        for k in d:
            d[k] = d[k] + 1
        return d
    out = ember.compile(fn, fullgraph=True)(torch.ones(2))
    ref = fn(torch.ones(2))
    assert list(out) == list(ref)
    for k in ref:
        torch.testing.assert_close(out[k], ref[k])
