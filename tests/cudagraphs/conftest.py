import pytest

import ember.cudagraphs as cg
from tests.cudagraphs.fake_cuda import FakeCuda


@pytest.fixture
def fake():
    """A fresh fake CUDA API and fresh pools/counters for each test."""
    cg.reset()
    yield FakeCuda()
    cg.reset()
