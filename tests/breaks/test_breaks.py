"""One test per graph-break case: ember.compile(fn) == eager over repeated calls (outputs, printed
text and logs, exceptions, mutated inputs, globals / containers / module state, grads), graphs
really compiled, and fullgraph=True refusing the break."""
import collections

import pytest

from .harness import load_all_cases, run_case

CASES = load_all_cases()


def test_suite_size():
    assert len(CASES) >= 220, len(CASES)
    by_topic = collections.Counter(c.topic for c in CASES)
    assert len(by_topic) >= 9, by_topic


def _param(c):
    marks = [pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else []
    return pytest.param(c, id=c.name, marks=marks)


@pytest.mark.parametrize("c", [_param(c) for c in CASES])
def test_case(c):
    run_case(c)
