"""Probe (issue 25, CPU): the ATen calls one cpu_suite step makes, eager vs ember, from torch.profiler
(CPU activity): calls per step and self CPU time per op, sorted; top-level totals beside them.

    PYTHONPATH=. taskset -c 1 python benchmarks/probes/cpu_step_ops.py mlp_train [N=20 steps] [TOPK=25]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("T", "1")))
import cpu_suite  # noqa: E402
import ember  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

wl = sys.argv[1]
N = int(os.environ.get("N", "20"))
TOPK = int(os.environ.get("TOPK", "25"))
for name, wrap in (("eager", lambda f: f), ("ember", ember.compile)):
    torch.manual_seed(0)
    build, inputs, _ = cpu_suite.make(wl, False)
    step = build(wrap)
    for _ in range(5):
        step(*inputs)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(N):
            step(*inputs)
    agg = {}
    for e in p.events():
        a = agg.setdefault(e.name, [0, 0.0, 0.0])
        a[0] += 1
        a[1] += e.self_cpu_time_total
        a[2] += e.cpu_time_total
    tot = sum(a[1] for a in agg.values()) / N
    print(f"== {wl} {name}: self CPU {tot / 1e3:.3f} ms/step, {sum(a[0] for a in agg.values()) / N:.0f} events/step")
    for k, (c, s, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:TOPK]:
        print(f"   {s / N:9.1f} us self {t / N:9.1f} us total {c / N:5.1f}x  {k[:70]}")
