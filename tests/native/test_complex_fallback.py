"""A graph with complex tensors runs its ATen code, the reason logged: neither renderer spells complex
types (Triton has none: the kernel's launch raised KeyError 'complex64', the backward of
linalg.eigvals in the OpInfo sweep, benchmarks/probes/opinfo_sweep.py)."""
import pytest
import torch

pytest.importorskip("triton")

from ember.native import compile_aten_graph  # noqa: E402
from tests.native.harness import DEVICE, trace  # noqa: E402


@pytest.mark.parametrize("force_triton", [True, False], ids=["triton", "cpp"])
def test_complex_graph_runs_aten(force_triton, native_cache):
    x = torch.randn(6, 4, 2, device=DEVICE)
    fn = lambda x: ((torch.view_as_complex(x) * (2 - 1j)).exp() * 3,)  # noqa: E731
    gm = trace(fn, [x])
    opts = {"cache_dir": native_cache} if force_triton else {"cache_dir": native_cache, "cpu_codegen": "cpp"}
    compiled = compile_aten_graph(gm, [x], force_triton=force_triton, options=opts)
    assert "complex" in (compiled.ember_native["reason"] or "")
    torch.testing.assert_close(compiled(x)[0], fn(x)[0])
