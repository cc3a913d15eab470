"""The native-backend tests here run generated Triton kernels in the interpreter on CPU tensors, which
needs ``TRITON_INTERPRET=1`` before triton is imported (as in tests/native/conftest.py)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    # the interpreter evaluates masked-off lanes too (log(0), 1/0 there are expected and discarded)
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture
def native_cache(tmp_path, monkeypatch):
    """A fresh kernel/graph cache, also for graphs compiled through ember.compile."""
    from ember.config import config

    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    return str(tmp_path)
