import pytest

import ember.cudagraphs as cg
from tests.cudagraphs.fake_cuda import FakeCuda


@pytest.fixture
def fake():
    """A fresh fake CUDA API and fresh pools/counters for each test. The runner keeps its production
    settings: in particular a second recording of the same shapes is off
    (runner.REPLACE_RECORDINGS is False), so what would need one disables the runner instead."""
    from ember.cudagraphs import runner

    assert runner.REPLACE_RECORDINGS is False, "the tests check the production setting"
    cg.reset()
    yield FakeCuda()
    cg.reset()
