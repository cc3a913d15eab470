"""Paired CPU probe (issue 25): ember's layer_norm+GELU (1024x1024 and 8192x1024 fp32) against
``y.copy_(x)`` in rounds alternating in ONE process, timed by process CPU time (``cpu``: robust to
the time-slicing of a shared VM; 1 thread only, since spinning OpenMP workers add CPU time) or wall
time (``wall``). Prints medians, minima, ember's % of copy (median of neighbouring-round ratios,
with quartiles, and of the minima) and the max abs error against eager. To compare two trees, run
it once per tree (``PYTHONPATH=<tree>``), alternating A B B A.

    PYTHONPATH=. python benchmarks/probes/ln_gelu_cputime.py cpu 25 [threads]
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import ember

torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
torch.manual_seed(0)
clock = time.process_time if sys.argv[1] == "cpu" else time.perf_counter
for rows in (1024, 8192):
    x = torch.randn(rows, 1024)
    w, b = torch.randn(1024), torch.randn(1024)
    f = lambda x, w, b: F.gelu(F.layer_norm(x, (1024,), w, b))  # noqa: E731
    cf = ember.compile(f)
    err = (cf(x, w, b) - f(x, w, b)).abs().max().item()
    y = torch.empty_like(x)
    cands = {"ember": lambda: cf(x, w, b), "copy": lambda: y.copy_(x)}
    n = 40 if rows == 1024 else 5
    ts = {k: [] for k in cands}
    for c in cands.values():
        c()
        c()
    for _ in range(int(sys.argv[2])):
        for k, c in cands.items():
            t = clock()
            for _ in range(n):
                c()
            ts[k].append((clock() - t) / n)
    ratios = [c / e for c, e in zip(ts["copy"], ts["ember"])]
    q = statistics.quantiles(ratios, n=4)
    print(f"ln_gelu {rows}x1024 [{sys.argv[1]}, {torch.get_num_threads()} thread(s)]: ember "
          f"{statistics.median(ts['ember'])*1e3:.3f} ms (min {min(ts['ember'])*1e3:.3f}), copy "
          f"{statistics.median(ts['copy'])*1e3:.3f} ms (min {min(ts['copy'])*1e3:.3f}); % of copy: paired median "
          f"{100*statistics.median(ratios):.1f} (quartiles {100*q[0]:.1f}-{100*q[2]:.1f}), min-based "
          f"{100*min(ts['copy'])/min(ts['ember']):.1f}; max abs err vs eager {err:.2e}", flush=True)
