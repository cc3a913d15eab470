"""Wall time of each phase of ember's first call of a gpu_suite workload (H100 probe).

    EMBER_CACHE_DIR=/tmp/c TRITON_CACHE_DIR=/tmp/t python benchmarks/probes/compile_phases.py gpt2_infer cold
    EMBER_CACHE_DIR=/tmp/c TRITON_CACHE_DIR=/tmp/t python benchmarks/probes/compile_phases.py gpt2_infer warm

Run twice with the same cache directories: the first is a cold compile, the second a warm one.
Prints the first call's time and the time spent in the frontend, the autograd layer's analysis,
tracing and cache, and the native backend's code generation and parallel kernel builds. Triton's
cache key is computed before timing and printed apart (the backend computes it in the background).
"""
import sys, os, time, collections, functools
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
import gpu_suite as gs
wl = sys.argv[1]
torch.manual_seed(0)
build, inputs, nb = gs.make(wl, "cuda", False)
torch.cuda.synchronize()
print("dynamo imported before compile:", "torch._dynamo" in sys.modules)
T = collections.defaultdict(float)
N = collections.Counter()
def wrap(mod, name, label):
    f = getattr(mod, name)
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[label] += time.perf_counter() - t; N[label] += 1
    setattr(mod, name, g)
t0 = time.perf_counter()
import ember
t_imp = time.perf_counter() - t0
import ember.frontend.convert as cv, ember.aot.pipeline as pl, ember.aot.analysis as an, ember.native.backend as nb_, ember.native.runtime as rt
import ember.aot.trace as tr
wrap(cv, "_compile", "frontend._compile (all)")
wrap(pl, "build_variant", "aot.build_variant (incl backend)")
wrap(pl.aot_cache, "load", "aot.cache.load")
wrap(pl, "_trace_parts", "aot._trace_parts")
wrap(pl.aot_cache, "store", "aot.cache.store")
wrap(an, "collect", "aot.analysis.collect")
wrap(pl, "trace_forward", "aot.trace_forward")
wrap(pl, "trace_joint", "aot.trace_joint")
wrap(nb_, "compile_aten_graph", "native.compile_aten_graph")
wrap(nb_, "_generate", "native._generate (cold)")
wrap(rt, "precompile", "native.precompile")
import ember.native.build_pool as bp
wrap(bp, "build_ahead", "native.build_pool.build_ahead")
wrap(nb_.cache, "graph_key", "native.graph_key")
try:
    import triton.runtime.cache as tc
    t = time.perf_counter(); tc.triton_key(); T["triton_key"] = time.perf_counter() - t
except Exception as e:
    print(e)
step = build(gs.compiler_fn("ember", "default"))
t1 = time.perf_counter()
step(*inputs); torch.cuda.synchronize()
tot = time.perf_counter() - t1
print(f"{wl} {sys.argv[2]}: first call {tot:.2f} s (+ import ember {t_imp:.2f} s)")
for k, v in T.items():
    print(f"  {k:40s} {v:7.3f} s  x{N[k]}")
print(f"  kernels built: {nb_.COUNTERS}; build pool: {bp.STATS}")
