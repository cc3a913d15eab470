"""Timeline of a small row's cold first call (issue 29: compile time of one-kernel graphs), as
``compile_time.py`` measures it (fresh process, empty caches, imports and an eager run first).

    python benchmarks/probes/small_cold_timeline.py overhead            # on the H100 (workers, launchers)
    python benchmarks/probes/small_cold_timeline.py overhead --cpu      # CPU: Triton forced (interpreter)

Prints when each traced piece started and ended (ms from the first call; thread or worker), in
order: the frontend's trace, the autograd layer's ATen trace and its decomposition table, the
native backend, Triton's cache key (``triton_key``) and driver creation (prewarm threads), the
build pool (spawn, each worker's "ready" and answer: its build and launcher seconds), the
specialization capture, the wait before the first launch, and Triton's compile/launcher calls in this
process. What is on the critical path is what the first result waits for.
"""
from __future__ import annotations

import importlib
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE) + "/benchmarks")
from compile_time import _time_phases  # noqa: E402  (stdlib imports only: the import timings stay torch's and ember's)

EV: list = []
T0 = [0.0]


def _now():
    return (time.perf_counter() - T0[0]) * 1000


def _record(label, start, end):
    """compile_time._time_phases' per-call hook: one event, in ms from the first call."""
    EV.append(((start - T0[0]) * 1000, (end - T0[0]) * 1000, label, threading.current_thread().name))


def spans(specs):
    """Time each (module, attribute[, label]) of ``specs`` as compile_time.py times its phases (one
    wrapper for both), every call recorded as an event; the label defaults to 'module.attribute'."""
    _time_phases([(spec[2] if len(spec) > 2 else f"{spec[0].split('.')[-1]}.{spec[1]}", spec[0], spec[1])
                  for spec in specs], on_call=_record)


def main():
    row = sys.argv[1]
    cpu = "--cpu" in sys.argv
    tmp = tempfile.mkdtemp(prefix="small_cold_")
    os.environ["EMBER_CACHE_DIR"] = os.path.join(tmp, "ember")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
    if cpu:
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["EMBER_NATIVE_FORCE_TRITON"] = "1"
    dev = "cpu" if cpu else "cuda"
    t = time.perf_counter()
    for m in ("torch", "torch._subclasses.fake_tensor", "torch.fx.experimental.proxy_tensor", "torch._dynamo"):
        importlib.import_module(m)
    t1 = time.perf_counter()
    for m in ("ember", "ember.frontend.cache", "ember.aot", "ember.native.backend"):
        importlib.import_module(m)
    t2 = time.perf_counter()
    import torch
    from gpu_suite import make
    torch.manual_seed(0)
    build, inputs, _ = make(row, dev, cpu)
    with torch.no_grad():
        ref = build(lambda f: f)(*inputs)
    if not cpu:
        torch.cuda.synchronize()
    before = set(sys.modules)
    spans((("ember.frontend.convert", "_compile"), ("ember.aot.pipeline", "trace_forward_analyzed"),
           ("ember.aot.lazy_table", "LazyTable._get"), ("ember.native.decomp", "_build"),
           ("ember.native.backend", "compile_aten_graph"), ("ember.native.passes", "run"),
           ("ember.native.lowering", "lower"), ("ember.native.cache", "load_module"),
           ("ember.native.runtime", "precompile"), ("ember.native.build_pool", "specializations"),
           ("ember.native.build_pool", "build_ahead"), ("ember.native.build_pool", "wait"),
           ("ember.native.build_pool", "BuildPool.build"),
           ("ember.native.runtime", "Launch._first_locked"), ("ember.native.runtime", "Launch.adopt"),
           ("ember.frontend.persist", "store"), ("ember.aot.cache", "store"),
           ("triton.runtime.cache", "triton_key"), ("triton.runtime.driver", "_create_driver"),
           ("triton.compiler.compiler", "compile"), ("triton.backends.nvidia.driver", "CudaLauncher.__init__"),
           ("triton.runtime.jit", "JITFunction._do_compile")))
    import ember
    from ember.native import build_pool
    BP = build_pool.BuildPool
    orig_messages = BP._messages

    def messages(self, p):  # each worker's "ready" line and answers, when they arrive
        out = orig_messages(self, p)
        now = _now()
        if p in self.ready and (p, "ready") not in SEEN:
            SEEN.add((p, "ready"))
            EV.append((now, now, f"worker {p.pid} ready", "pool"))
        for m in out or ():
            EV.append((now - 1000 * m.get("s", 0), now, f"worker {p.pid} answer {m}", "pool"))
        return out
    SEEN: set = set()
    BP._messages = messages
    T0[0] = time.perf_counter()
    step = build(lambda f: ember.compile(f))
    out = step(*inputs)
    if not cpu:
        torch.cuda.synchronize()
    first = _now()
    EV.append((first, first, "FIRST RESULT", "main"))
    err = (out.float() - ref.float()).abs().max().item()
    print(f"{row} on {dev}: imports {t1 - t:.2f}+{t2 - t1:.2f} s; cold first call {first / 1000:.3f} s; err {err:.2e}")
    for s, e, label, th in sorted(EV):
        print(f"  {s:8.1f} -> {e:8.1f} ms ({e - s:7.1f})  [{th[:20]:<20}] {label[:160]}")
    new = sorted(m for m in set(sys.modules) - before)
    print(f"modules imported during the first call ({len(new)}): {' '.join(new)[:3000]}")
    print("build_pool", build_pool.STATS)


if __name__ == "__main__":
    main()
