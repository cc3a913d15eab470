"""Probe (H100): Python GC during a gpu_suite workload's steady loops: tracked objects after compiling,
collections per generation (count, ms) over five timed loops, then the same loops with GC disabled.
usage: python benchmarks/probes/gc_in_loop.py WL eager|ember|torch"""
import sys, gc, time, torch
sys.path.insert(0, "benchmarks")
import gpu_suite
wl, comp = sys.argv[1], sys.argv[2]
step, inputs = gpu_suite.warm_step(wl, comp)
print(wl, comp, "gc-tracked objects", len(gc.get_objects()), "gc counts", gc.get_count(), "thresholds", gc.get_threshold())
stats = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}; t0 = [0.0]
def cb(phase, info):
    if phase == "start": t0[0] = time.perf_counter()
    else: s = stats[info["generation"]]; s[0] += 1; s[1] += (time.perf_counter() - t0[0]) * 1e3
gc.callbacks.append(cb)
n = 200 if wl in ("mlp", "overhead") else 30
res = []
for _ in range(5):
    s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record()
    for _ in range(n): step(*inputs)
    e.record(); e.synchronize(); res.append(round(s.elapsed_time(e) / n, 4))
gc.callbacks.remove(cb)
print(wl, comp, "loops ms/step", res, "gc per gen (count, ms) over 5 loops", stats)
gc.disable()
res = []
for _ in range(5):
    s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record()
    for _ in range(n): step(*inputs)
    e.record(); e.synchronize(); res.append(round(s.elapsed_time(e) / n, 4))
print(wl, comp, "gc disabled loops ms/step", res)
