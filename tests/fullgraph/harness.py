"""Differential cases for constructs that torch.compile captures with ``fullgraph=True`` (issue 26).

Each ``test_<family>.py`` collects its cases with its own ``Cases()`` registry and runs them through
the corpus runner (``tests/corpus/harness.run_case``): eager vs ``ember.compile(fullgraph=True)`` on
identical inputs, comparing outputs, inputs after the call (mutation), aliasing, gradients, and a
cache hit on fresh inputs. ``run`` adds the point of these files: the function is one graph
(exactly one graph handed to the backend, whatever the case computes).
"""
from __future__ import annotations

import torch

from tests.corpus.harness import Case, make_inputs, run_case, INPUT_SEED, _call


class Cases(list):
    """A family's registry: ``@cases.case(inputs)`` registers a function case."""

    def __init__(self, family: str):
        super().__init__()
        self.family = family

    def case(self, inputs=None, *, kwargs=None, name=None, atol=None, rtol=None):
        def deco(fn):
            self.append(Case(name=f"{self.family}.{name or fn.__name__}", fn=fn, inputs=inputs or (lambda: ()),
                             kwargs=kwargs, atol=atol, rtol=rtol, topic=self.family))
            return fn
        return deco

    def ids(self):
        return [c.name for c in self]


def run(c: Case) -> None:
    import ember
    from ember.testing import CompileCounter

    run_case(c)
    cnt = CompileCounter()
    args, kw = make_inputs(c, INPUT_SEED)
    _call(ember.compile(c.fn, backend=cnt, fullgraph=True), args, kw)
    assert cnt.frame_count == 1, f"{c.name}: {cnt.frame_count} graphs, expected exactly one"


def t(*shape, grad=False, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype, requires_grad=grad)
