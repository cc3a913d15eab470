"""How a graph's C++ kernels are split over translation units that build in parallel
(``cpp_build.partition``), and the compiler check that no longer holds up the first graph's trace."""
import shutil

import pytest
import torch

from ember.native import compile_aten_graph, cpp_build, runtime
from tests.native.harness import compare, trace

needs_cxx = pytest.mark.skipif(not any(map(shutil.which, ("c++", "g++"))), reason="no C++ compiler")


def test_partition_balances_and_keeps_small_graphs_whole(monkeypatch):
    monkeypatch.setattr(cpp_build, "UNIT_MIN_COST", 3000)
    monkeypatch.setattr(cpp_build, "KERNEL_COST", 600)
    assert cpp_build.partition([500], 4) == [[0]]
    assert cpp_build.partition([1000, 1000], 4) == [[0, 1]]  # 3200: one unit's worth, not two
    assert cpp_build.partition([500, 1088, 2731, 2409], 1) == [[0, 1, 2, 3]]
    # the encoder layer's four kernels on two build threads: the two reductions apart
    assert cpp_build.partition([500, 1088, 2731, 2409], 2) == [[0, 2], [1, 3]]
    groups = cpp_build.partition([2000] * 8, 4)
    assert sorted(i for g in groups for i in g) == list(range(8)) and len(groups) == 4
    assert cpp_build.partition([2000] * 8, 4) == groups  # deterministic: a warm process finds the same units


@needs_cxx
def test_a_graph_split_over_units_computes_like_eager(native_cache, monkeypatch):
    monkeypatch.setattr(cpp_build, "UNIT_MIN_COST", 1)
    monkeypatch.setattr(runtime, "compile_threads", lambda: 3)

    def fn(x, w):
        y = torch.softmax(x * 0.5, -1)
        z = torch.nn.functional.layer_norm(x + 1.0, (x.shape[-1],), w)
        return y.sum(0), z.amax(-1), torch.tanh(z) * y
    x, w = torch.randn(32, 48), torch.randn(48)
    compiled = compile_aten_graph(trace(fn, [x, w]), [x, w], options={"cpu_codegen": "cpp", "cache_dir": native_cache})
    units = [p for p in compiled.ember_native["kernels"] if p.endswith(".cpp")]
    assert len(units) >= 2, units
    for got, ref in zip(compiled(x, w), fn(x, w)):
        compare(got, ref)


@needs_cxx
def test_check_in_flight_does_not_block_and_a_failed_check_runs_aten(native_cache, monkeypatch, tmp_path):
    """``problem(wait=False)`` answers None while the check runs; a graph generated meanwhile whose
    check then fails runs its ATen graph at the first call (right results, the reason recorded)."""
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\nsleep 1\necho 'fake-cxx: broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setattr(cpp_build, "_PROBED", {})
    monkeypatch.setattr(cpp_build, "_PROBE_STARTED", set())
    monkeypatch.setattr(cpp_build, "_WARNED", set())
    compiler_id = cpp_build.compiler_id
    monkeypatch.setattr(cpp_build, "compiler_id", lambda cxx: compiler_id(shutil.which("g++") or shutil.which("c++")))
    assert cpp_build.problem(native_cache, wait=False) is None  # (the check is running: a second of it)
    x = torch.randn(5, 7)
    compiled = compile_aten_graph(trace(lambda x: torch.sigmoid(x) * 2.0, [x]), [x],
                                  options={"cpu_codegen": "cpp", "cache_dir": native_cache})
    compare(compiled(x), torch.sigmoid(x) * 2.0)
    assert "no working C++ compiler" in compiled.ember_native["reason"]
    assert "fake-cxx: broken" in cpp_build.problem(native_cache)
