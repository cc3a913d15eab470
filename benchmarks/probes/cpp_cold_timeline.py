"""Probe (CPU): where a cold first call of a cpu_suite row spends its wall time, as a timeline of
ember's phases and of every C++ compiler run (which thread, when), in one fresh process with an
empty cache (imports excluded, as in cpu_suite.py). Run it under the CPU timing lock:

    flock /tmp/ember-cpu-bench.lock python benchmarks/probes/cpp_cold_timeline.py encoder --repeat 3

Each repeat is a fresh process with a fresh EMBER_CACHE_DIR; the per-phase lines are (start, end)
seconds after the call began. ``--env K=V`` passes ember settings.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# (module, function): the phases recorded (the outermost call of a recursive one)
SPANS = [("ember.frontend.convert", "_compile"), ("ember.aot.pipeline", "build_variant"),
         ("ember.aot.trace", "trace_forward"), ("ember.aot.trace", "trace_joint"),
         ("ember.native.backend", "plan"), ("ember.native.backend", "_generate"),
         ("ember.native.lowering", "lower"), ("ember.native.scheduler", "schedule"),
         ("ember.native.cpp_build", "problem"), ("ember.native.cpp_build", "_compile"),
         ("ember.native.cpp_graph", "_bind")]


def child(wl: str) -> dict:
    import importlib
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import cpu_suite
    torch.manual_seed(0)
    build, inputs, _ = cpu_suite.make(wl, False)
    wrap, _ = cpu_suite.compiler_fn("ember")
    events, t0 = [], [0.0]

    def patch(modname, fname):
        mod = importlib.import_module(modname)
        fn = getattr(mod, fname)

        def timed(*a, **k):
            s = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                events.append((fname if fname != "_compile" else f"{modname.rsplit('.', 1)[-1]}._compile",
                               threading.current_thread().name, s - t0[0], time.perf_counter() - t0[0]))
        setattr(mod, fname, timed)
    for m, f in SPANS:
        patch(m, f)
    t0[0] = time.perf_counter()
    step = build(wrap)
    step(*inputs)
    total = time.perf_counter() - t0[0]
    return dict(total=round(total, 3), events=[(n, th, round(s, 3), round(e, 3)) for n, th, s, e in sorted(events, key=lambda x: x[2])])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.workload)))
        return
    totals = []
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory(prefix="ember-timeline-") as tmp:
            env = dict(os.environ, PYTHONPATH=ROOT, EMBER_CACHE_DIR=tmp, OMP_NUM_THREADS="1")
            env.update(kv.split("=", 1) for kv in a.env)
            p = subprocess.run([sys.executable, __file__, a.workload, "--child"], env=env, capture_output=True, text=True)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            sys.exit(p.stderr[-3000:])
        r = json.loads(line[-1][7:])
        totals.append(r["total"])
        print(f"{a.workload}: first call {r['total']} s")
        for n, th, s, e in r["events"]:
            print(f"  {s:6.3f} {e:6.3f} {e - s:6.3f}  {n:<22} {th}")
    print("totals", totals)


if __name__ == "__main__":
    main()
