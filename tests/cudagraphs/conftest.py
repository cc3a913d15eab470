import pytest

import ember.cudagraphs as cg
from tests.cudagraphs.fake_cuda import FakeCuda


@pytest.fixture
def fake(monkeypatch):
    """A fresh fake CUDA API and fresh pools/counters for each test. The logic of replacing a
    recording is tested here, on the fake API, although it is switched off on real GPUs for now
    (runner.REPLACE_RECORDINGS)."""
    from ember.cudagraphs import runner

    monkeypatch.setattr(runner, "REPLACE_RECORDINGS", True)
    cg.reset()
    yield FakeCuda()
    cg.reset()
