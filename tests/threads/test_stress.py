"""Many threads calling compiled code with mixed (and dynamic) shapes on the default, aot_eager and
openvino backends: every result equals eager and nothing falls back to eager. The fast version runs
in CI; the slow one is the full 8 threads x 500 calls."""
import pytest

from tests.threads import stress

# OpenVINO partitions share one infer request across threads ("Infer Request is busy", or wrong values
# when two infers interleave): being fixed in ember/backends/openvino/runtime.py on another branch
# (issue 23). Until then the openvino case may fail, so it is a non-strict xfail; drop the mark with
# that fix (with a lock around OVPartition.forward, this workload passes every time).
_OV_SHARED_REQUEST = pytest.mark.xfail(strict=False, reason="shared OpenVINO infer request (issue 23, openvino part)")
BACKENDS = ["ember", "aot_eager", pytest.param("openvino", marks=_OV_SHARED_REQUEST)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_fast(backend):
    if backend == "openvino":
        pytest.importorskip("openvino")
    stress.check(stress.run(backend, n_threads=4, n_calls=30))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_stress(backend):
    if backend == "openvino":
        pytest.importorskip("openvino")
    stress.check(stress.run(backend, n_threads=8, n_calls=500))


def test_native_triton_kernels_from_threads(monkeypatch):
    """The native backend generating Triton kernels (run by Triton's interpreter on CPU) while
    several threads compile and launch them."""
    from ember.config import config
    monkeypatch.setattr(config, "native_force_triton", True)
    stress.check(stress.run("ember", n_threads=3, n_calls=6))
