import os
import sys

import pytest
import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)


@pytest.fixture(autouse=True)
def _restore_global_torch_state():
    """A failing case must not leak grad mode / autocast / default dtype into the next one."""
    grad = torch.is_grad_enabled()
    dtype = torch.get_default_dtype()
    yield
    torch.set_grad_enabled(grad)
    torch.set_default_dtype(dtype)
    torch.set_autocast_enabled("cpu", False)
