"""One test per corpus case: compiled == eager (outputs, mutated inputs, grads), then a cache hit."""
import pytest

from .harness import load_all_cases, run_case

CASES = load_all_cases()


def test_corpus_size():
    functions = [c for c in CASES if not c.is_module]
    modules = [c for c in CASES if c.is_module]
    assert len(functions) >= 250, len(functions)
    assert len(modules) >= 25, len(modules)


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_case(c):
    run_case(c)
