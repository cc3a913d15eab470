"""Probe (H100): the per-call host cost of a replayed graph in a compiling (cold) process and in
warm-cache processes, to explain why tiny_hf's steady time differed between them (0.0912 ms cold vs
0.1365 ms warm in one ``--jobs 1`` run, 0.242 vs 0.096 in another).

    python benchmarks/probes/replay_host_cost.py --out /tmp/replay_host_cost.json
    python benchmarks/probes/replay_host_cost.py --workload tiny_hf --calls 500 --warm 2 --out out.json

Runs one cold process (fresh EMBER_CACHE_DIR and TRITON_CACHE_DIR, as gpu_suite's ember row) and
``--warm`` processes on its caches (gpu_suite's ember-warm), one after the other (nothing else runs).
Each process compiles the workload (``gpu_suite.warm_step``, 20 calls more), then reports:

- ``loops``: 5 loops of ``--calls`` calls: host us per call (``perf_counter`` around the loop, no
  sync inside: what the host spends issuing) and wall us per call (to a synchronize after the loop);
- ``gc_loops``: the same with Python's garbage collector off, and the collections seen in ``loops``;
- ``profile``: cProfile over ``--calls`` calls, the 15 functions of most own time (and the 15 of
  most cumulative time): where a difference between processes would show up;
- ``state``: what the per-call path depends on and could differ between a cold and a warm process:
  the CUDA-graph decisions and counters, each runner's recording (static inputs and why, copied
  inputs, outputs returned as aliases or copies), launch-path counters, the frontend's cache entries
  and their guard counts, live threads and child processes (the cold process's kernel-build workers);
- ``pool_closed_loops`` (cold process, where the build workers are alive): the loops again after
  closing them (``build_pool.close``), to tell their CPU use apart from the per-call path.

The ``summary`` compares each process's median host us per call with the cold one's. Expected if
the per-call path is the same: warm/cold within a few percent, the same top functions, equal
``state`` (apart from the threads and workers).
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)


def _sync():
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _loops(step, inputs, calls: int, n: int = 5) -> list:
    out = []
    for _ in range(n):
        _sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            step(*inputs)
        t1 = time.perf_counter()
        _sync()
        t2 = time.perf_counter()
        out.append(dict(host_us=round((t1 - t0) / calls * 1e6, 2), wall_us=round((t2 - t0) / calls * 1e6, 2)))
    return out


def _median(loops, key="host_us"):
    return round(statistics.median(x[key] for x in loops), 2) if loops else None


def _profile(step, inputs, calls: int) -> dict:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step(*inputs)
    prof.disable()
    _sync()
    out = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(15)
        out[key] = [ln for ln in buf.getvalue().splitlines() if ln.strip()][-16:]
    return out


def _runners() -> list:
    from ember.cudagraphs import Runner
    from ember.cudagraphs.measure import Measured
    out = []
    for obj in gc.get_objects():
        if isinstance(obj, Measured):
            out.append(dict(measured=obj.name, decision=obj.decision, calls=obj.calls))
        elif isinstance(obj, Runner):
            rec = obj.current
            d = dict(runner=obj.name, disabled=obj.disabled, recordings=len(obj.recordings), demoted=sorted(obj.demoted))
            if rec is not None:
                d.update(static={str(k): v for k, v in rec.static_kind.items()},
                         copied=[p.index for p in rec.placeholders], consts=len(rec.consts),
                         outputs_alias_copy=list(rec.mode), stable_checks=len(rec.stable),
                         watch=len(rec.pool.entries))
            out.append(d)
    return out


def _children() -> list:
    me, out = os.getpid(), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == me:  # (ppid)
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    out.append(f.read().replace(b"\0", b" ").decode(errors="replace")[:120])
        except OSError:
            continue
    return out


def _state() -> dict:
    import ember.cudagraphs as cg
    from ember.cudagraphs import auto
    from ember.native import runtime
    st = dict(decisions=[list(d) for d in auto.DECISIONS], cudagraphs=cg.stats(), launch=dict(runtime.STATS),
              runners=_runners(), threads=[t.name for t in threading.enumerate()], children=_children(),
              gc_tracked=len(gc.get_objects()), gc_counts=gc.get_count())
    entries = []
    for obj in gc.get_objects():
        if type(obj).__name__ == "CacheEntry" and type(obj).__module__ == "ember.frontend.convert":
            entries.append(dict(id=obj.id, source_lines=len(obj.source.splitlines()), guards=len(obj.guards), has_graph=obj.graph is not None,
                                compiled=type(obj.namespace.get("__graph")).__name__))
    st["frontend_entries"] = entries
    try:
        from ember.aot import cache as aot_cache
        st["aot_cache"] = dict(aot_cache.STATS)
    except Exception:  # noqa: BLE001 - informative only
        pass
    return st


def child(args) -> dict:
    sys.path.insert(0, BENCH)
    import gpu_suite as gs
    t0 = time.perf_counter()
    step, inputs = gs.warm_step(args.workload, "ember", dev=args.device)
    first_s = time.perf_counter() - t0
    for _ in range(20):
        step(*inputs)
    _sync()
    collections = {0: 0, 1: 0, 2: 0}

    def cb(phase, info):
        if phase == "stop":
            collections[info["generation"]] += 1
    gc.callbacks.append(cb)
    loops = _loops(step, inputs, args.calls)
    gc.callbacks.remove(cb)
    gc.disable()
    gc_loops = _loops(step, inputs, args.calls)
    gc.enable()
    rec = dict(kind=args.child, workload=args.workload, first_s=round(first_s, 3), calls=args.calls,
               loops=loops, host_us=_median(loops), wall_us=_median(loops, "wall_us"),
               gc_collections_in_loops=collections, gc_loops=gc_loops, gc_off_host_us=_median(gc_loops),
               profile=_profile(step, inputs, args.calls), state=_state())
    from ember.native import build_pool
    pool = build_pool.get()
    if pool is not None and pool.alive():
        rec["build_workers_alive"] = len(pool.alive())
        pool.close()
        time.sleep(0.5)
        rec["pool_closed_loops"] = _loops(step, inputs, args.calls)
        rec["pool_closed_host_us"] = _median(rec["pool_closed_loops"])
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="tiny_hf")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--warm", type=int, default=2, help="warm-cache processes after the cold one")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", help="cuda (the probe); cpu only checks that it runs")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args), default=str), flush=True)
        return 0
    sys.path.insert(0, BENCH)
    import gpu_suite as gs
    tmp = tempfile.mkdtemp(prefix="replay_host_cost_")
    results = []
    try:
        env = gs.child_env(tmp)
        env.update(EMBER_CACHE_DIR=os.path.join(tmp, "ember"), TRITON_CACHE_DIR=os.path.join(tmp, "triton"))
        for kind in ["cold"] + [f"warm{i + 1}" for i in range(args.warm)]:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--workload", args.workload,
                   "--calls", str(args.calls), "--out", args.out, "--device", args.device]
            r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
            if r.returncode or not lines:
                results.append(dict(kind=kind, status="failed", rc=r.returncode, stderr=r.stderr[-3000:]))
            else:
                results.append(dict(json.loads(lines[-1][len("RESULT "):]), status="ok"))
            res = results[-1]
            print(f"{kind}: host {res.get('host_us')} us/call, wall {res.get('wall_us')} us/call, gc off "
                  f"{res.get('gc_off_host_us')}, pool closed {res.get('pool_closed_host_us')} ({res.get('status')})",
                  flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cold = results[0].get("host_us") if results else None
    summary = {r["kind"]: dict(host_us=r.get("host_us"), wall_us=r.get("wall_us"),
                               vs_cold=round(r["host_us"] / cold, 3) if cold and r.get("host_us") else None)
               for r in results}
    import torch
    out = dict(probe="replay_host_cost", workload=args.workload, calls=args.calls,
               device=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
               date=time.strftime("%Y-%m-%d %H:%M:%S"), summary=summary, processes=results)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(json.dumps(summary, indent=1))
    for r in results:
        if r.get("status") == "ok":
            print(f"--- {r['kind']}: top own time over {args.calls} calls")
            print("\n".join(r["profile"]["tottime"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
