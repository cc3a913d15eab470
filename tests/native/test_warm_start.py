"""A process that starts from a warm cache takes the decisions of the process that compiled: the
same generated wrappers (kernels, launch configs, extern choices, buffer reuse), the same launch
sites (grid, block sizes, warps, stages) and launch paths, and it starts no build workers (nothing to
build). The per-call launcher path (direct C launcher or Triton's) is decided only on a GPU: there,
benchmarks/probes/warm_decisions.py prints it per site (run by benchmarks/probes/h28_gpu_check.sh)."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from ember.native import compile_aten_graph, runtime  # noqa: E402
from tests.native.harness import DEVICE, trace  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = os.path.join(ROOT, "benchmarks", "probes", "warm_decisions.py")


def _decisions(workload, tmp_path):
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_path / "ember"), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               TRITON_INTERPRET="1", EMBER_NATIVE_FORCE_TRITON="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, PROBE, workload, "--device", "cpu"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    lines = [l for l in out.stdout.splitlines() if l.startswith("DECISIONS ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("DECISIONS "):])


@pytest.mark.parametrize("workload", ["tiny_block", "tiny_block_train"])
def test_a_warm_process_takes_the_cold_processes_decisions(workload, tmp_path):
    sys.path.insert(0, os.path.dirname(PROBE))
    try:
        from warm_decisions import comparable
    finally:
        sys.path.remove(os.path.dirname(PROBE))
    cold, warm, warm2 = (_decisions(workload, tmp_path) for _ in range(3))
    assert cold["graphs"] and all(not g["hit"] for g in cold["graphs"])  # it compiled...
    assert all(g["hit"] for g in warm["graphs"] + warm2["graphs"])  # ...the others loaded its graphs
    assert cold["aot"]["stores"] >= 1 and warm["aot"]["hits"] >= 1 and warm["aot"]["misses"] == 0
    assert all(g["launches"] for g in cold["graphs"])
    assert comparable(warm) == comparable(cold)
    assert comparable(warm2) == comparable(cold)
    if workload.endswith("_train"):
        assert len(cold["graphs"]) == 2  # forward and backward


def test_build_workers_start_only_for_a_graph_to_generate(tmp_path, monkeypatch):
    """prewarm_triton only records the wish; a cache miss starts the pool, a hit does not."""
    started = []
    monkeypatch.setattr(runtime, "want_builds", lambda: started.append(True))
    x = torch.randn(16, device=DEVICE)
    gm = trace(lambda x: torch.sin(x) * 2, [x])
    compile_aten_graph(gm, [x], force_triton=True, options={"cache_dir": str(tmp_path)})
    assert started == [True]
    gm = trace(lambda x: torch.sin(x) * 2, [x])
    fn = compile_aten_graph(gm, [x], force_triton=True, options={"cache_dir": str(tmp_path)})
    assert fn.ember_native["cache_hit"] and started == [True]


def test_want_builds_starts_the_wished_pool(monkeypatch):
    from ember.native import build_pool
    calls = []
    monkeypatch.setattr(build_pool, "start", lambda n: calls.append(n))
    monkeypatch.setattr(runtime, "_POOL_WORKERS", 0)
    monkeypatch.setattr(runtime, "_PREWARM", False)  # (no prewarm thread in a test)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # (read per call: Triton itself was imported before)
    runtime.want_builds()
    assert calls == []  # nobody asked for workers
    runtime.prewarm_triton(6)
    assert calls == []  # asking is not starting
    runtime.want_builds()
    assert calls == [6]


def _no_threads(monkeypatch):
    """Stand-ins for the prewarm threads: which ones start, none running."""
    import threading
    started = []

    class Thread:
        def __init__(self, target, name, daemon):
            self.name = name

        def start(self):
            started.append(self.name)
    monkeypatch.setattr(threading, "Thread", Thread)
    for attr in ("_PREWARM", "_DRIVER_PREWARM"):
        monkeypatch.setattr(runtime, attr, None)
    monkeypatch.setattr(runtime, "_POOL_WORKERS", 0)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # (read per call: Triton itself was imported before)
    from ember.native import build_pool, triton_cache
    monkeypatch.setattr(build_pool, "start", lambda n: None)
    monkeypatch.setattr(triton_cache, "ensure_safe", lambda: None)
    return started


def test_decorating_does_not_hash_triton_a_trace_or_a_miss_does(monkeypatch):
    """Triton's cache key (a hash of libtriton, 0.3-0.4 s) is only needed to build a kernel: the
    backend's start at decoration creates Triton's driver only (what a warm start's launches need);
    the key starts when a frame is traced (the backend's ``prewarm_trace``) or a cache misses."""
    from ember.backends import ember_backend
    started = _no_threads(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runtime, "prewarm_cuda", lambda: None)
    ember_backend._prewarm()
    assert started == ["ember-triton-driver"]
    ember_backend._prewarm_trace()
    assert started == ["ember-triton-driver", "ember-triton-prewarm"]
    ember_backend._prewarm_trace()  # (once per process)
    runtime.want_builds()
    assert started == ["ember-triton-driver", "ember-triton-prewarm"]
    monkeypatch.setattr(runtime, "_PREWARM", None)
    runtime.want_builds()  # (a miss without a trace: a frame from the frontend's cache, a graph not)
    assert started == ["ember-triton-driver", "ember-triton-prewarm", "ember-triton-prewarm"]
