"""Shared setup of the OpenVINO backend tests (each module skips itself without openvino).

Tests ask OpenVINO for fp32 inference (``helpers.F32``), so results can be held to 1e-4 relative; the
default precision is tested separately with its documented tolerance (docs/openvino.md).
"""
import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)


def require_openvino():
    """Skip the calling module unless OpenVINO's runtime and PyTorch frontend import cleanly (a
    partial or mismatched install raises errors other than ImportError)."""
    try:
        import openvino  # noqa: F401
        from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"openvino is not usable here: {type(exc).__name__}: {exc}", allow_module_level=True)


@pytest.fixture(autouse=True)
def _no_openvino_env(monkeypatch):
    """Tests decide the backend's options themselves: clear the user's OPENVINO_TORCH_* defaults."""
    for var in ("OPENVINO_TORCH_BACKEND_DEVICE", "OPENVINO_TORCH_MODEL_CACHING", "OPENVINO_TORCH_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def reports():
    """The openvino backend's reports of the graphs compiled during the test."""
    from ember.backends import openvino
    openvino.clear_reports()
    return openvino.reports
