"""Paired CPU probe (issue 25): eager vs ember per cpu_suite workload in ONE process, single calls
alternating (a shared machine's load drifts far less between neighbouring calls than between
processes). Prints median per-call times and the ratio of medians (and of 10th percentiles).

    PYTHONPATH=. taskset -c 1 python benchmarks/probes/cpu_pair.py mlp cnn mlp_train     # SECS=6 per row, T=1 thread
    PYTHONPATH=. taskset -c 1 python benchmarks/probes/cpu_pair.py --copy softmax_1k ln_gelu_8k

``--copy`` (memory-bound rows): ember, ``y.copy_(x)`` and eager alternate per call; prints ember's
bandwidth as a percentage of the copy's (the suite's 70% target), measured side by side.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("T", "1")))
import cpu_suite  # noqa: E402
import ember  # noqa: E402


def p10(xs):
    return sorted(xs)[len(xs) // 10]


def run(wl, secs):
    torch.manual_seed(0)
    build, inputs, _ = cpu_suite.make(wl, False)
    step = build(ember.compile)
    torch.manual_seed(0)
    build2, inputs2, _ = cpu_suite.make(wl, False)
    twin = build2(lambda f: f)
    for _ in range(3):
        step(*inputs)
        twin(*inputs2)
    E, C = [], []
    pc, end, i = time.perf_counter, time.perf_counter() + secs, 0
    while pc() < end or i < 20:
        order = ((twin, inputs2, E), (step, inputs, C))
        for fn, a, out in (order if i % 2 else order[::-1]):
            t = pc()
            fn(*a)
            out.append(pc() - t)
        i += 1
    me, mc = statistics.median(E), statistics.median(C)
    print(f"{wl:12s} n={len(E):5d} eager {me * 1e3:8.3f} ms ember {mc * 1e3:8.3f} ms  ratio of medians {me / mc:.3f}"
          f"  of p10 {p10(E) / p10(C):.3f}", flush=True)


def run_copy(wl, secs):
    torch.manual_seed(0)
    build, inputs, nbytes = cpu_suite.make(wl, False)
    step = build(ember.compile)
    eager = build(lambda f: f)
    x = inputs[0]
    y = torch.empty_like(x)
    fns = {"ember": lambda: step(*inputs), "copy": lambda: y.copy_(x), "eager": lambda: eager(*inputs)}
    T = {k: [] for k in fns}
    for f in fns.values():
        f()
        f()
    pc, end, n = time.perf_counter, time.perf_counter() + secs, 0
    while pc() < end or n < 10:
        for k, f in fns.items():
            t = pc()
            r = f()
            T[k].append(pc() - t)
            del r
        n += 1
    q = {k: statistics.median(v) for k, v in T.items()}
    print(f"{wl:11s} n={n:4d} ember {q['ember'] * 1e3:7.3f} ms copy_ {q['copy'] * 1e3:7.3f} ms eager {q['eager'] * 1e3:7.3f} ms"
          f"  ember {100 * q['copy'] / q['ember']:.0f}% of copy_, eager {100 * q['copy'] / q['eager']:.0f}%,"
          f" speedup {q['eager'] / q['ember']:.2f}", flush=True)


if __name__ == "__main__":
    secs = float(os.environ.get("SECS", "6"))
    args = sys.argv[1:]
    for wl in [w for w in args if w != "--copy"]:
        (run_copy if "--copy" in args else run)(wl, secs)
