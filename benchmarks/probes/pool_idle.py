"""Step time of a gpu_suite workload under ember with the kernel-build workers alive, then after
closing them (H100 probe: idle workers must not slow a step).

    python benchmarks/probes/pool_idle.py resnet50_train
"""
import sys, os, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpu_suite as gs
wl = sys.argv[1]
step, inputs = gs.warm_step(wl, "ember")
from ember.native import build_pool
def t():
    return statistics.median(gs.loop_times(lambda: step(*inputs), 30, 5, True))
print(wl, "pool alive", len(build_pool.get().alive()) if build_pool.get() else None, "ms", round(t(), 3), flush=True)
build_pool.get().close()
print(wl, "pool closed", len(build_pool.get().alive()), "ms", round(t(), 3), flush=True)
print(wl, "again", round(t(), 3), flush=True)
