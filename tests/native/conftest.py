"""Native-backend tests run the generated Triton kernels: on a GPU when there is one, otherwise in
the Triton interpreter on CPU tensors (``TRITON_INTERPRET=1`` must be set before triton is imported,
which is why it is set here, at collection)."""
import os
import sys

import pytest
import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    # the interpreter evaluates masked-off lanes too (log(0), 1/0 there are expected and discarded)
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture(scope="session")
def native_cache(tmp_path_factory):
    """A fresh kernel/graph cache for the session, so results never come from an older run."""
    return str(tmp_path_factory.mktemp("ember_native_cache"))
