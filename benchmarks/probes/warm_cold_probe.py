"""Why does a warm or cold process run a different steady speed? One process: compile, time, diagnose.

    EMBER_CACHE_DIR=/tmp/c/x TRITON_CACHE_DIR=/tmp/c/tx python benchmarks/probes/warm_cold_probe.py gpt2_train cold out.jsonl
    (again with the same caches: the warm process). Results: benchmarks/results/warm_cold_variance-h100-s41.json
"""
import gc, io, json, os, sys, threading, time, cProfile, pstats
sys.path.insert(0, "benchmarks")
import torch
wl, tag, out = sys.argv[1], sys.argv[2], sys.argv[3]
from gpu_suite import make, compiler_fn
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.manual_seed(0)
build, inputs, _ = make(wl, "cuda", False)
step = build(compiler_fn("ember", "default"))
t0 = time.perf_counter(); torch.manual_seed(1); step(*inputs); torch.cuda.synchronize()
rec = dict(wl=wl, tag=tag, first_s=round(time.perf_counter() - t0, 3))
for _ in range(5):
    step(*inputs)
torch.cuda.synchronize()
iters = 30 if wl.endswith("train") or "resnet" in wl else 200

def loops(n=5):
    dev, host = [], []
    for _ in range(n):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); h0 = time.perf_counter()
        for _ in range(iters):
            step(*inputs)
        h = (time.perf_counter() - h0) / iters * 1e3
        e.record(); torch.cuda.synchronize()
        dev.append(round(s.elapsed_time(e) / iters, 4)); host.append(round(h, 4))
    return dict(ms=sorted(dev)[n // 2], ms_loops=dev, host_ms=host)

rec["base"] = loops()
rec["threads"] = [t.name for t in threading.enumerate()]
try:
    import psutil
    rec["children"] = len(psutil.Process().children(recursive=True))
except Exception as e:
    rec["children"] = repr(e)
rec["gc_count"] = gc.get_count(); rec["gc_objects"] = len(gc.get_objects())
rec["gc_stats"] = gc.get_stats()
# gc activity during steady calls
ncoll = [0, 0, 0]; tcoll = [0.0]
def cb(phase, info, _t=[0.0]):
    if phase == "start":
        _t[0] = time.perf_counter()
    else:
        ncoll[info["generation"]] += 1; tcoll[0] += time.perf_counter() - _t[0]
gc.callbacks.append(cb)
rec["with_gc_cb"] = loops(3)
gc.callbacks.remove(cb)
rec["gc_during"] = dict(per_gen=ncoll, s=round(tcoll[0], 4), calls=3 * iters)
# host profile
pr = cProfile.Profile(); pr.enable()
for _ in range(min(iters, 50)):
    step(*inputs)
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); rec["cprofile"] = s.getvalue()[-6000:]
# device profile
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        step(*inputs)
    torch.cuda.synchronize()
ka = prof.key_averages()
gpu = sorted([(k.key, k.device_time_total / 5, k.count / 5) for k in ka if k.device_time_total > 0], key=lambda x: -x[1])
rec["gpu_kernel_us_per_call"] = round(sum(g[1] for g in gpu), 1)
rec["gpu_top"] = [(a[:70], round(b, 1), c) for a, b, c in gpu[:25]]
rec["cuda_api"] = sorted([(k.key, k.count / 5) for k in ka if k.key.startswith(("cuda", "cu"))], key=lambda x: -x[1])[:12]
# experiments
from ember.native import build_pool
p = build_pool.get()
if p is not None:
    p.close()
time.sleep(1)
rec["after_pool_close"] = loops()
gc.collect(); gc.freeze()
rec["after_gc_freeze"] = loops()
try:
    from ember.cudagraphs import auto
    rec["decisions"] = [[n, bool(r), w] for n, r, w in auto.DECISIONS][:8]
    from ember.native import runtime
    rec["launch"] = dict(runtime.STATS)
except Exception as e:
    rec["decisions"] = repr(e)
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "a") as f:
    f.write(json.dumps(rec) + "\n")
print(tag, wl, "first", rec["first_s"], "ms", rec["base"]["ms"], "host", rec["base"]["host_ms"][0], "gpu_sum_us", rec["gpu_kernel_us_per_call"],
      "pool_closed", rec["after_pool_close"]["ms"], "gcfreeze", rec["after_gc_freeze"]["ms"], "gc", rec["gc_during"], "threads", len(rec["threads"]), flush=True)
