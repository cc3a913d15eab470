"""Paired CPU probe (issue 25, cpp_vector): in ONE process, ember with the portable C++ loops
(native_cpu_simd='portable'), ember with the explicit AVX-512 loops ('auto'), ``torch.empty_like(x).copy_(x)``
and ``y.copy_(x)`` alternate in rounds; prints median and min per call and ember's percentage of each
copy (median of neighbouring-round ratios, and of the minima).

    PYTHONPATH=. python benchmarks/probes/cpp_simd_paired.py 1 40 ln1k,sm1k,ln8k,sm8k   # threads, rounds, rows
"""
import sys, time, statistics, torch, ember, ember.config
import torch.nn.functional as F
th = int(sys.argv[1]); rounds = int(sys.argv[2]); which = sys.argv[3].split(",")
torch.set_num_threads(th); torch.manual_seed(0)
def rnd(fn, n):
    t = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - t) / n
for w in which:
    rows = 1024 if "1k" in w else 8192
    x = torch.randn(rows, 1024)
    if w.startswith("ln"):
        wt, b = torch.randn(1024), torch.randn(1024)
        f = lambda x, w, b: F.gelu(F.layer_norm(x, (1024,), w, b)); args = (x, wt, b)
    else:
        f = lambda x: torch.softmax(x * 0.125, -1); args = (x,)
    fns = {}
    for mode in ("portable", "auto"):
        ember.config.native_cpu_simd = mode
        t0 = time.perf_counter()
        cf = ember.compile(f)
        out = cf(*args)
        ref = f(*args)
        fns[mode] = cf
        print(f"  {w} {mode}: first call {time.perf_counter() - t0:.2f}s, rel err {((out - ref).abs().max() / ref.abs().max()).item():.1e}")
    y = torch.empty_like(x)
    cands = {"portable": lambda: fns["portable"](*args), "auto": lambda: fns["auto"](*args),
             "empty_like.copy_": lambda: torch.empty_like(x).copy_(x), "y.copy_": lambda: y.copy_(x)}
    n = 20 if rows == 1024 else 3
    ts = {k: [] for k in cands}
    for c in cands.values(): c(); c()
    for _ in range(rounds):
        for k, c in cands.items(): ts[k].append(rnd(c, n))
    med = {k: statistics.median(v) for k, v in ts.items()}
    line = f"{w} t{th}: " + ", ".join(f"{k} {med[k]*1e3:.3f} ms (min {min(ts[k])*1e3:.3f})" for k in cands)
    print(line)
    for mode in ("portable", "auto"):
        pe = statistics.median([c / k for c, k in zip(ts["empty_like.copy_"], ts[mode])])
        py = statistics.median([c / k for c, k in zip(ts["y.copy_"], ts[mode])])
        print(f"   {mode}: {100*pe:.0f}% of empty_like(x).copy_(x), {100*py:.0f}% of y.copy_(x) (paired medians); min-based {100*min(ts['empty_like.copy_'])/min(ts[mode]):.0f}% / {100*min(ts['y.copy_'])/min(ts[mode]):.0f}%", flush=True)
