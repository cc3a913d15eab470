"""Probe (H100): one gpu_suite workload's step: wall ms per step (CUDA events, three loops), device
kernel time and kernel count per step with the kernels taking the most time (torch.profiler), then a
cProfile of the loop. usage: python benchmarks/probes/step_profile.py WL eager|ember|torch
(NOPROF=1: no cProfile; TOPK=N: kernels listed)"""
import sys, time, cProfile, pstats, io, torch
sys.path.insert(0, "benchmarks")
import gpu_suite
wl, comp = sys.argv[1], sys.argv[2]
step, inputs = gpu_suite.warm_step(wl, comp)
n = 200 if wl in ("mlp", "overhead") else 20
def timed():
    s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record()
    t = time.perf_counter()
    for _ in range(n): step(*inputs)
    cpu = (time.perf_counter() - t) / n * 1e3
    e.record(); e.synchronize(); return s.elapsed_time(e) / n, cpu
print(wl, comp, "event ms/step, cpu-return ms/step", [timed() for _ in range(3)])
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(5): step(*inputs)
    torch.cuda.synchronize()
ev = [e for e in p.events() if e.device_type.name == "CUDA"]
tot = sum(e.device_time for e in ev) / 5 / 1e3
print(wl, comp, f"device kernel ms/step {tot:.3f} kernels/step {len(ev)/5:.0f}")
agg = {}
for e in ev:
    a = agg.setdefault(e.name[:60], [0, 0.0]); a[0] += 1; a[1] += e.device_time / 5 / 1e3
import os
for k, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:int(os.environ.get('TOPK', 12))]:
    print(f"   {t:8.3f} ms {c/5:5.0f}x {k}")
if os.environ.get('NOPROF'): sys.exit(0)
pr = cProfile.Profile(); pr.enable()
for _ in range(n): step(*inputs)
torch.cuda.synchronize(); pr.disable()
s = io.StringIO(); ps = pstats.Stats(pr, stream=s); ps.sort_stats("tottime").print_stats(28); print(s.getvalue()[:9000])
