"""Many threads calling compiled code with mixed (and dynamic) shapes on the default, aot_eager and
openvino backends: every result equals eager and nothing falls back to eager. The fast version runs
in CI; the slow one is the full 8 threads x 500 calls."""
import pytest
import torch

from tests.threads import stress

# on a GPU machine the default backend's Triton kernels run for real (CUDA tensors); openvino is CPU-only
CUDA = torch.cuda.is_available()


def _device(backend):
    return "cuda" if CUDA and backend != "openvino" else "cpu"

BACKENDS = ["ember", "aot_eager", "openvino"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_fast(backend):
    if backend == "openvino":
        pytest.importorskip("openvino")
    stress.check(stress.run(backend, n_threads=4, n_calls=30, device=_device(backend)))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_stress(backend):
    if backend == "openvino":
        pytest.importorskip("openvino")
    stress.check(stress.run(backend, n_threads=8, n_calls=500, device=_device(backend)))


def test_native_triton_kernels_from_threads(monkeypatch):
    """The native backend generating Triton kernels (on the GPU, or run by Triton's interpreter on
    CPU) while several threads compile and launch them."""
    from ember.config import config
    monkeypatch.setattr(config, "native_force_triton", True)
    stress.check(stress.run("ember", n_threads=3, n_calls=6, device="cuda" if CUDA else "cpu"))
