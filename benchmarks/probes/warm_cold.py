"""Probe: is a compiling (cold) process's steady call slower or faster than a warm-cache process's, and
why (ember issue 28: "warm-process steady time within 3% of the compiling process's on every row").

    flock /tmp/ember-cpu-bench.lock python benchmarks/probes/warm_cold.py --device cpu --out /tmp/wc.json
    python benchmarks/probes/warm_cold.py --device cuda --workloads overhead,mlp,tiny_hf,resnet50_infer \\
        --rounds 2 --out benchmarks/results/warm_cold-h100.json

Per workload (gpu_suite's ``make``: the same models, inputs and compile call; ``--quick`` shapes on a
CPU), ``--rounds`` rounds of: one cold process (fresh EMBER_CACHE_DIR and TRITON_CACHE_DIR) then
``--warm`` warm processes on its caches, one process at a time (a spread between two warm processes
of the same caches is the machine's, not the cache's). Each process compiles, calls the step 5 times (as
gpu_suite does before timing) and reports:

- ``wall_loops`` / ``loops``: ``--loops`` loops of ``--calls`` calls (gpu_suite's counts by default),
  us per call to a synchronize after the loop (what gpu_suite's CUDA events see; the ratios use it)
  and host us per call (perf_counter around the issuing loop alone), each loop preceded by
  a ``calib`` loop: a fixed piece of pure Python (``_calibration``), whose time says how fast this
  process's CPU is at that moment (core, frequency, neighbours). ``norm`` = host us / calib us: a
  difference between processes that ``norm`` does not show is the machine, not ember's call path;
- ``thread_cpu_frac`` / ``process_cpu_frac``: the main thread's and the whole process's CPU time over
  a loop's wall time (median): below 1, the main thread was preempted or blocked (a driver call that
  waits, the GIL held by another thread); the process above the thread, another thread of it ran;
  ``cpus``: the CPU the process was on after each loop (``gpu_local_cpus``: the GPU's NUMA node);
- ``memory``: RSS, how much of it is on transparent huge pages, the THP setting; ``hashseed``: the
  process's PYTHONHASHSEED (random per process and recorded, unless ``--hashseed``): a slow process
  can be rerun as it was;
- ``gc``: collections per generation (and ms) during those loops (``gc.callbacks``), objects tracked;
- ``threads_first`` / ``threads_steady``: live threads (names) right after the first call and after the
  5 warm-up calls; ``children``: child processes (the build workers);
- ``chain``: the compiled callable the frontend calls, down to the compiled function (each object's
  type, a measured graph's decision);
- ``decisions``: the automatic CUDA-graph decisions (``auto.DECISIONS``), ``reused`` the ones read
  from the cache instead of measured;
- paired A/B, interleaved loop by loop in the same process: ``gc_frozen`` (``gc.freeze()`` vs not),
  on a GPU ``idle_gpu`` (a synchronize before each call, the call alone timed: host time with an empty
  launch queue, vs back to back: a difference is the host waiting on the device), and ``pool_closed``
  (build workers and C++ build threads ended; before/after, normalized by ``calib``).

The summary line per workload: cold and warm median host us per call and warm/cold, raw and
normalized. Success (issue 28): warm/cold within 0.97-1.03 on every row, the same chain, the same
decisions (a measured one ``reused`` in the warm process), no ember thread alive in steady state.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
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


def _calibration(n: int = 2000) -> float:
    """us per iteration of a fixed piece of Python (attribute reads, a call, a dict lookup, a tuple):
    the same work in every process, so its time is the CPU's speed, not ember's."""
    class O:
        a = 1
    o, d = O(), {"k": 1}

    def f(x, y):
        return (x, y)
    t0 = time.perf_counter()
    for i in range(n):
        f(o.a, d.get("k", i))
    return (time.perf_counter() - t0) / n * 1e6


def _cpu() -> int | None:
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])  # field 39: the CPU last run on
    except (OSError, IndexError, ValueError):
        return None


def _children() -> int:
    me, n = os.getpid(), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    n += int(f.read().rsplit(")", 1)[1].split()[1]) == me
            except (OSError, IndexError, ValueError):
                pass
    return n


def _memory() -> dict:
    """RSS and how much of it is in transparent huge pages (a heap on 4 KiB pages pays more TLB misses
    per call), and the system's THP setting."""
    out = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("Rss", "AnonHugePages"):
                    out[k] = int(v.split()[0])
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            out["thp"] = f.read().strip()
    except (OSError, ValueError):
        pass
    return out


def _gpu_local_cpus() -> str | None:
    """The CPUs next to the GPU (its PCI device's local_cpulist): a process on another NUMA node
    pays more per launch."""
    try:
        import torch
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        with open(f"/sys/bus/pci/devices/{bus}/local_cpulist") as f:
            return f.read().strip()
    except Exception:  # noqa: BLE001 - informative only
        return None


def _chain(obj, depth: int = 0, seen=None) -> list:
    """The objects between the frontend's compiled graph and the compiled function, by the attributes
    that hold the next one (a variant's ``compiled``, a measured graph's ``_target``, ...)."""
    seen = seen if seen is not None else set()
    if obj is None or id(obj) in seen or depth > 8:
        return []
    seen.add(id(obj))
    name = type(obj).__name__
    if name == "function":
        return [f"function {getattr(obj, '__qualname__', '?')}"]
    if name == "method":
        return [f"method {getattr(obj, '__qualname__', '?')}"]
    label = name
    if name == "Measured":
        label += f"[{'decided ' + str(obj.decision[0]) if obj.decision else 'measuring'}]"
    out = [label]
    if isinstance(getattr(obj, "variants", None), dict):
        for v in obj.variants.values():
            out += ["  " * (depth + 1) + x for x in _chain(v, depth + 1, seen)]
        return out
    for attr in ("compiled", "compiled_fw", "_target", "fn"):
        nxt = getattr(obj, attr, None) if not isinstance(obj, type) else None
        if nxt is not None and callable(nxt):
            out += ["  " * (depth + 1) + f"{attr}: " + x.lstrip() if i == 0 else x
                    for i, x in enumerate(_chain(nxt, depth + 1, seen))]
            break
    return out


def _entries_chain() -> list:
    out = []
    for obj in gc.get_objects():
        if type(obj).__name__ == "CacheEntry" and type(obj).__module__ == "ember.frontend.convert":
            out.append(_chain(obj.namespace.get("__graph")))
    return out


def _threads() -> list:
    return sorted(f"{t.name}{'' if t.daemon else ' (non-daemon)'}" for t in threading.enumerate())


class _GC:
    """Collections per generation, and their ms, while ``on``."""

    def __init__(self):
        self.n, self.ms, self.t0, self.on = [0, 0, 0], [0.0, 0.0, 0.0], 0.0, False

    def __call__(self, phase, info):
        if not self.on:
            return
        if phase == "start":
            self.t0 = time.perf_counter()
        else:
            g = info["generation"]
            self.n[g] += 1
            self.ms[g] = round(self.ms[g] + (time.perf_counter() - self.t0) * 1e3, 3)


def child(args) -> dict:
    sys.path.insert(0, BENCH)
    import gpu_suite as gs
    import torch
    cuda = args.device.startswith("cuda")
    if not cuda:
        torch.set_num_threads(1)  # (as gpu_suite on a CPU)
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    build, inputs, _ = gs.make(args.workload, args.device, args.quick)
    t0 = time.perf_counter()
    step = build(gs.compiler_fn("ember", "default"))
    step(*inputs)
    sync()
    first_s = time.perf_counter() - t0
    rec = dict(kind=args.child, workload=args.workload, first_s=round(first_s, 3), threads_first=_threads())
    if args.collect_first:  # the full collection a compile's heap brings, before the steady calls, not in them
        t = time.perf_counter()
        rec["collected"] = gc.collect()
        rec["collect_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    for _ in range(5):
        step(*inputs)
    sync()
    rec.update(threads_steady=_threads(), children=_children(), cpu=_cpu())

    cpu_use = []  # per loop: (main thread's CPU time, the process's) / wall time
    walls = []  # per loop: us per call to a synchronize after the loop (what gpu_suite's events see)

    def loop(n=args.calls, each_sync=False):
        if each_sync:  # the call alone, on an idle device
            total = 0.0
            for _ in range(n):
                sync()
                t = time.perf_counter()
                step(*inputs)
                total += time.perf_counter() - t
            sync()
            return round(total / n * 1e6, 3)
        sync()
        t, th, pr = time.perf_counter(), time.thread_time(), time.process_time()
        for _ in range(n):
            step(*inputs)
        host = time.perf_counter() - t
        # (< 1: the main thread did not run all the time: preempted, or blocked in a driver call or
        # on the GIL; process > thread: another thread of this process used a CPU meanwhile)
        cpu_use.append((round((time.thread_time() - th) / host, 3), round((time.process_time() - pr) / host, 3)))
        sync()
        walls.append(round((time.perf_counter() - t) / n * 1e6, 3))
        return round(host / n * 1e6, 3)

    g = _GC()
    gc.callbacks.append(g)
    g.on = True
    loops, calib, cpus = [], [], []
    since_first = time.perf_counter() - t0 - first_s
    for _ in range(args.loops):
        calib.append(round(_calibration(), 4))
        loops.append(loop())
        cpus.append(_cpu())
    g.on = False
    host = statistics.median(loops)
    cal = statistics.median(calib)
    wall = statistics.median(walls[:args.loops])
    rec.update(loops=loops, calib=calib, host_us=host, calib_us=cal, norm=round(host / cal, 2),
               wall_loops=walls[:args.loops], wall_us=wall,
               loops_start_s_after_first=round(since_first, 3), cpus=cpus,
               thread_cpu_frac=statistics.median(c[0] for c in cpu_use),
               process_cpu_frac=statistics.median(c[1] for c in cpu_use),
               gc=dict(collections=g.n, ms=g.ms, tracked=len(gc.get_objects()), counts=gc.get_count()),
               threads_after_loops=_threads(), affinity=len(os.sched_getaffinity(0)), nice=os.nice(0),
               memory=_memory(), hashseed=os.environ.get("PYTHONHASHSEED"))
    if cuda:
        rec["gpu_local_cpus"] = _gpu_local_cpus()

    # paired A/B, interleaved: gc.freeze() (everything alive now out of every later collection) or not
    ab = {"plain": [], "frozen": []}
    for _ in range(args.loops):
        ab["plain"].append(loop())
        gc.freeze()
        ab["frozen"].append(loop())
        gc.unfreeze()
    rec["gc_frozen"] = {k: dict(loops=v, median=statistics.median(v)) for k, v in ab.items()}
    if cuda:
        ab = {"back_to_back": [], "idle_gpu": []}
        for _ in range(args.loops):
            ab["back_to_back"].append(loop())
            ab["idle_gpu"].append(loop(max(20, args.calls // 4), each_sync=True))
        rec["idle_gpu"] = {k: dict(loops=v, median=statistics.median(v)) for k, v in ab.items()}

    from ember.cudagraphs import auto
    rec["decisions"] = [list(d) for d in auto.DECISIONS]
    rec["reused"] = [d[0] for d in auto.DECISIONS if d[2].startswith("reused measured decision")]
    rec["measured"] = [d[0] for d in auto.DECISIONS if d[2].startswith("measured ")]
    rec["chain"] = _entries_chain()
    try:
        import ember.cudagraphs as cg
        rec["cudagraphs"] = {k: (len(v) if isinstance(v, list) else v) for k, v in cg.stats().items()}
    except Exception:  # noqa: BLE001 - informative only
        pass

    # the build workers and C++ build threads ended: before/after (calibrated), this process only
    from ember.native import build_pool
    pool = build_pool.get()
    closed = []
    if pool is not None and pool.alive():
        pool.close()
        closed.append("build workers")
    for obj in gc.get_objects():
        if type(obj).__name__ == "BuildThreads" and obj.threads:
            obj.close()
            closed.append(obj.name)
    if closed:
        before = [loop() for _ in range(args.loops)]
        time.sleep(0.2)
        after, cal2 = [], []
        for _ in range(args.loops):
            cal2.append(round(_calibration(), 4))
            after.append(loop())
        rec["pool_closed"] = dict(closed=closed, before=statistics.median(before), after=statistics.median(after),
                                  calib_after=statistics.median(cal2), threads=_threads())
    return rec


def _calls(wl: str, args) -> int:
    """Calls per loop: ``--calls``, else gpu_suite's (200 for its microsecond rows, 30 for the models;
    100 on a CPU)."""
    if args.calls is not None:
        return args.calls
    return 100 if not args.device.startswith("cuda") else 200 if wl in ("overhead", "mlp") else 30


def _run(kind, wl, env, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--workloads", wl, "--device", args.device,
           "--calls", str(_calls(wl, args)), "--loops", str(args.loops)]
    if args.quick:
        cmd.append("--quick")
    if args.pin is not None:
        cmd += ["--pin", str(args.pin)]
    if args.collect_first:
        cmd.append("--collect-first")
    # a recorded hash seed per process (str hashes, so set and dict layouts): a slow process can be
    # rerun with its seed; --hashseed gives every process the same one
    seed = str(args.hashseed if args.hashseed is not None else random.randrange(1, 2**32 - 1))
    r = subprocess.run(cmd, env=dict(env, PYTHONHASHSEED=seed), cwd=ROOT, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode or not lines:
        return dict(kind=kind, workload=wl, status="failed", rc=r.returncode, stderr=r.stderr[-3000:])
    return dict(json.loads(lines[-1][len("RESULT "):]), status="ok")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="overhead,mlp,tiny_hf")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=2, help="cold+warm pairs per workload, each on fresh caches")
    p.add_argument("--calls", type=int, default=None, help="calls per loop (default: gpu_suite's, 100 on a CPU)")
    p.add_argument("--loops", type=int, default=5)
    p.add_argument("--warm", type=int, default=1, help="warm processes after each cold one")
    p.add_argument("--quick", action="store_true", help="gpu_suite's tiny shapes (default on a CPU)")
    p.add_argument("--pin", type=int, default=None, help="run every process on this CPU (os.sched_setaffinity)")
    p.add_argument("--collect-first", action="store_true", help="gc.collect() right after the first call, in every process")
    p.add_argument("--hashseed", type=int, default=None, help="PYTHONHASHSEED of every process (default: random, recorded)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.device.startswith("cuda"):
        args.quick = True
    if args.child:
        args.workload = args.workloads
        print("RESULT " + json.dumps(child(args), default=str), flush=True)
        return 0
    sys.path.insert(0, BENCH)
    import gpu_suite as gs
    results, summary = [], {}
    base = tempfile.mkdtemp(prefix="warm_cold_")
    try:
        env = gs.child_env(base)
        for wl in args.workloads.split(","):
            pairs = []
            for r in range(args.rounds):
                tmp = os.path.join(base, f"{wl}-{r}")
                e = dict(env, EMBER_CACHE_DIR=os.path.join(tmp, "ember"), TRITON_CACHE_DIR=os.path.join(tmp, "triton"))
                cold = _run("cold", wl, e, args)
                warms = [_run("warm" if k == 0 else f"warm{k + 1}", wl, e, args) for k in range(args.warm)]
                results += [dict(x, round=r) for x in [cold] + warms]
                pairs += [(cold, w) for w in warms if cold["status"] == w["status"] == "ok"]
                for x in [cold] + warms:
                    if x["status"] != "ok":
                        print(f"{wl} {x['kind']} round {r}: FAILED rc={x.get('rc')}\n{x.get('stderr', '')[-1500:]}", flush=True)
                        continue
                    print(f"{wl:15s} {x['kind']:5s} r{r}: wall {x['wall_us']:8.2f} us/call (loops {x['wall_loops']}), host {x['host_us']:8.2f}, "
                          f"calib {x['calib_us']:.4f}, norm {x['norm']}, gc {x['gc']['collections']} "
                          f"{x['gc']['ms']} ms, frozen {x['gc_frozen']['frozen']['median']} vs {x['gc_frozen']['plain']['median']}"
                          + (f", idle-gpu {x['idle_gpu']['idle_gpu']['median']} vs {x['idle_gpu']['back_to_back']['median']}"
                             if 'idle_gpu' in x else "")
                          + (f", pool closed {x['pool_closed']['before']} -> {x['pool_closed']['after']}" if 'pool_closed' in x else ""),
                          flush=True)
                    print(f"{'':15s}      cpu use thread {x['thread_cpu_frac']} process {x['process_cpu_frac']}, cpus {x['cpus']}"
                          f"{' (gpu local ' + str(x.get('gpu_local_cpus')) + ')' if 'gpu_local_cpus' in x else ''}, "
                          f"loops start {x['loops_start_s_after_first']} s after the first call, first call {x['first_s']} s, "
                          f"memory {x['memory']}, hash seed {x['hashseed']}")
                    print(f"{'':15s}      threads first {x['threads_first']}, steady {x['threads_steady']}, children {x['children']}, cpu {x['cpu']}")
                    print(f"{'':15s}      decisions {[(d[0], d[1], d[2][:70]) for d in x['decisions']]}")
                    print(f"{'':15s}      chain " + " | ".join(" / ".join(c) for c in x["chain"]))
            if pairs:
                # wall time (to a synchronize after each loop): a device-bound row's host only issues
                raw = [w["wall_us"] / c["wall_us"] for c, w in pairs]
                norm = [w["norm"] / c["norm"] for c, w in pairs]
                summary[wl] = dict(warm_vs_cold=[round(x, 3) for x in raw], warm_vs_cold_norm=[round(x, 3) for x in norm],
                                   same_chain=all(c["chain"] == w["chain"] for c, w in pairs),
                                   same_decisions=all([d[1] for d in c["decisions"]] == [d[1] for d in w["decisions"]]
                                                      for c, w in pairs),
                                   # every graph the cold process measured, the warm one reused (not measured)
                                   measured_reused=all(len(w["reused"]) == len(c["measured"]) and not w["measured"]
                                                       for c, w in pairs),
                                   ember_threads_steady=sorted({t for c, w in pairs for t in c["threads_steady"] + w["threads_steady"]
                                                                if t.startswith("ember") and "cpp-build" not in t}))
                s = summary[wl]
                s["ok"] = (all(0.97 <= x <= 1.03 for x in s["warm_vs_cold"]) and s["same_chain"] and s["same_decisions"]
                           and s["measured_reused"])
                s["ok_norm"] = all(0.97 <= x <= 1.03 for x in s["warm_vs_cold_norm"])  # (the path alone, host speed aside)
                print(f"== {wl}: warm/cold {s}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(dict(probe="warm_cold", device=args.device, date=time.strftime("%Y-%m-%d %H:%M:%S"),
                           calls={wl: _calls(wl, args) for wl in args.workloads.split(",")}, loops=args.loops, summary=summary, processes=results), f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
