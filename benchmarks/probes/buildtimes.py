"""Cold-compile timeline of one compile_time.py row on the GPU: when each Triton build batch went to
the build pool, each kernel's build seconds, when and how long first launches waited, when each
compile phase first started and its total, then the steady step time (issue 29 probe).

    python benchmarks/probes/buildtimes.py llama_train OUTDIR [--label cap32] [--steps 20]
    python benchmarks/probes/buildtimes.py llama_train OUTDIR --label s39 --s39-fusion   # A/B arm: s39's kernels

Fresh ember and Triton caches, one process; without ``--eager-first`` no eager run first (so
``total_s`` also holds what any first call pays: CUDA context, cuBLAS, cuDNN; compile_time.py's
``compile_s`` does not; with it, ``total_s`` measures what ``compile_s`` does). Writes
``OUTDIR/buildtimes-ROW[-LABEL].json`` and copies the 4 slowest kernels' sources next to it.
Steady state: the median (and min/max) of ``--steps`` step times after 5 calls (the auto-CUDA-graph
decision is taken on calls 2-4), each synchronized.
"""
from __future__ import annotations

import argparse
import collections
import functools
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository: its ember

# (label, module, attribute) timed besides llama_cold.PHASES: the GPU-only steps before a first launch
GPU_PHASES = (
    ("native: _compile (one graph)", "ember.native.backend", "_compile"),
    ("native: precompile", "ember.native.runtime", "precompile"),
    ("pool: specializations", "ember.native.build_pool", "specializations"),
    ("pool: start", "ember.native.build_pool", "start"),
    ("warm_launch: remember", "ember.native.warm_launch", "remember"),
    ("aot: partition", "ember.aot.partition", "partition"),
    ("cudagraphs: compile_auto", "ember.cudagraphs.auto", "compile_auto"),
    ("runtime: prewarm_triton", "ember.native.runtime", "prewarm_triton"),
)


class Sampler:
    """The main thread's stack every ``interval`` s from a daemon thread (a statistical profile that
    costs ~1% where cProfile costs 2-3x): where the first call's wall time goes on the GPU host,
    including what the CPU probes cannot see (Triton's JIT, CUDA, waits). ``report`` gives inclusive
    and own time per function (ember, torch, triton and transformers frames) and, per half second of
    the timeline, the innermost ember function seen most."""

    def __init__(self, interval=0.005):
        import threading
        self.interval, self.samples, self.stop = interval, [], threading.Event()
        self.main = threading.main_thread().ident
        self.thread = threading.Thread(target=self.run, name="buildtimes-sampler", daemon=True)

    def start(self, t0):
        self.t0 = t0
        self.thread.start()

    def run(self):
        while not self.stop.wait(self.interval):
            f = sys._current_frames().get(self.main)
            stack = []
            while f is not None:
                c = f.f_code
                stack.append(f"{_short(c.co_filename)}:{c.co_name}")
                f = f.f_back
            self.samples.append((time.perf_counter() - self.t0, stack))

    def report(self, top=40):
        self.stop.set()
        self.thread.join()
        incl, own, buckets = collections.Counter(), collections.Counter(), collections.defaultdict(collections.Counter)
        ms = self.interval * 1e3
        for t, stack in self.samples:
            own[stack[0] if stack else "?"] += 1
            for fn in set(stack):
                incl[fn] += 1
            ember = next((fn for fn in stack if not fn.startswith(("buildtimes.py", "threading.py"))
                          and fn.split(":")[0] in _EMBER_FILES), None)
            buckets[int(t * 2) / 2][ember or (stack[0] if stack else "?")] += 1
        return dict(interval_ms=ms, n=len(self.samples),
                    inclusive_ms=[(k, round(v * ms)) for k, v in incl.most_common(top)],
                    own_ms=[(k, round(v * ms)) for k, v in own.most_common(top)],
                    timeline=[(b, [(k, round(v * ms)) for k, v in c.most_common(3)]) for b, c in sorted(buckets.items())])


def _short(path: str) -> str:
    base = os.path.basename(path)
    return f"{os.path.basename(os.path.dirname(path))}/{base}" if base == "__init__.py" else base


def _ember_files():
    import ember
    root = os.path.dirname(ember.__file__)
    return {_short(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if f.endswith(".py")}


_EMBER_FILES: set = set()


def wrap(phases, T0, PH):
    for label, modname, attr in phases:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        owner, name = mod, attr
        if "." in attr:
            cls, name = attr.split(".")
            owner = getattr(mod, cls, None)
        f = getattr(owner, name, None) if owner is not None else None
        if f is None:
            continue

        def make(f, label):
            @functools.wraps(f)
            def g(*a, **k):
                t = time.perf_counter()
                rec = PH[label]
                if T0[0] is not None and rec["first"] is None:
                    rec["first"] = round(t - T0[0], 3)
                try:
                    return f(*a, **k)
                finally:
                    rec["s"] += time.perf_counter() - t
                    rec["n"] += 1
                    if T0[0] is not None:
                        rec["last_end"] = round(time.perf_counter() - T0[0], 3)
            return g
        setattr(owner, name, make(f, label))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("row")
    p.add_argument("out")
    p.add_argument("--label", default="")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda", help="cpu with --quick: a smoke run of this script")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-sample", action="store_true", help="no stack sampling of the first call")
    p.add_argument("--eager-first", action="store_true", help="one eager step before the compile, as "
                   "compile_time.py runs (CUDA context, cuBLAS, cuDNN's attention plans and the optimizer's "
                   "state then exist: total_s is then comparable to its compile_s)")
    p.add_argument("--s39-fusion", action="store_true", help="session 39's kernels: no fusion cap "
                   "(native_max_fused_buffers=0) and libdevice values inlined in every reader "
                   "(lowering.GraphLowering.REALIZE_LIBDEVICE_NUMEL=0), for an A/B against the defaults")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cd = tempfile.mkdtemp(prefix="buildtimes_")
    os.environ["EMBER_CACHE_DIR"] = cd + "/e"
    os.environ["TRITON_CACHE_DIR"] = cd + "/t"
    import torch
    import compile_time as ct
    with torch.device(a.device):  # (the 1.2B model initialized on the GPU: seconds less than on the CPU)
        build, inputs = ct.make(a.row, a.device, a.quick)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    import ember  # noqa: F401
    import ember.aot  # noqa: F401
    import ember.frontend.convert  # noqa: F401
    import ember.native.backend  # noqa: F401
    from ember.native import build_pool as bp
    if a.s39_fusion:
        from ember.native import lowering
        ember.config.native_max_fused_buffers = 0
        lowering.GraphLowering.REALIZE_LIBDEVICE_NUMEL = 0
    from llama_cold import PHASES
    T0, EV = [None], []
    PH = collections.defaultdict(lambda: dict(first=None, s=0.0, n=0, last_end=None))
    wrap(PHASES + GPU_PHASES, T0, PH)
    orig = bp.BuildPool.build

    def build_patched(self, jobs):
        t = time.perf_counter() - T0[0]
        EV.append(dict(ev="batch", t=round(t, 3), n=len(jobs)))
        res = orig(self, jobs)
        byid = {j["id"]: j for j in jobs}
        for i, r in res.items():
            j = byid[i]
            EV.append(dict(ev="job", batch_t=round(t, 3), name=j["name"], path=j["path"], cost=j["cost"],
                           s=r.get("s"), launcher_s=r.get("launcher_s"), ok=r.get("ok")))
        EV.append(dict(ev="batch_done", t=round(time.perf_counter() - T0[0], 3)))
        return res
    bp.BuildPool.build = build_patched
    ow = bp.wait

    def wait_p(site=None):
        t = time.perf_counter()
        ow(site)
        d = time.perf_counter() - t
        if d > 0.01:
            EV.append(dict(ev="wait", t=round(t - T0[0], 3), s=round(d, 3)))
    bp.wait = wait_p
    if a.eager_first:  # (training: the step mutates the weights; the compiled step's numbers do not matter here)
        build(ct.compiler_fn("eager"))(*inputs)
        sync()
    _EMBER_FILES.update(_ember_files())
    sampler = None if a.no_sample else Sampler()
    T0[0] = time.perf_counter()
    if sampler:
        sampler.start(T0[0])
    step = build(ct.compiler_fn("ember"))
    step(*inputs)
    sync()
    total = time.perf_counter() - T0[0]
    profile = sampler.report() if sampler else None
    steps = []
    for i in range(5 + a.steps):
        t = time.perf_counter()
        step(*inputs)
        sync()
        if i >= 5:
            steps.append((time.perf_counter() - t) * 1e3)
    from ember.native.backend import COUNTERS
    jobs = sorted([e for e in EV if e["ev"] == "job"], key=lambda e: -(e["s"] or 0))
    suffix = f"-{a.label}" if a.label else ""
    for j in jobs[:4]:
        try:
            shutil.copy(j["path"], os.path.join(a.out, f"{a.row}{suffix}-slow-{j['name']}.py"))
        except OSError as e:
            print("copy", e)
    caps = {k: v for k, v in os.environ.items() if k.startswith("EMBER_NATIVE")}
    step_ms = dict(median=round(statistics.median(steps), 3), min=round(min(steps), 3), max=round(max(steps), 3),
                   n=len(steps)) if steps else None
    phases = {k: dict(v, s=round(v["s"], 3)) for k, v in PH.items()}
    rec = dict(row=a.row, label=a.label, env=caps, s39_fusion=a.s39_fusion, eager_first=a.eager_first, total_s=round(total, 3), step_ms=step_ms, stats=dict(bp.STATS),
               native=dict(COUNTERS), phases=phases, events=EV, sampled=profile, device=torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device)
    json.dump(rec, open(os.path.join(a.out, f"buildtimes-{a.row}{suffix}.json"), "w"), indent=1)
    print(f"{a.row} {a.label}: first result {total:.2f} s; steady step {step_ms} ms; kernels {COUNTERS}; "
          f"pool {dict(bp.STATS)}")
    for e in EV:
        if e["ev"] != "job":
            print("  ", e)
    for k, v in sorted(phases.items(), key=lambda kv: kv[1]["first"] if kv[1]["first"] is not None else 1e9):
        print(f"   phase {k:<34} first at {v['first']} s, {v['s']:.3f} s total x{v['n']}, last end {v['last_end']}")
    for j in jobs[:8]:
        print(f"   build {j['s']:.3f} s (launcher {j.get('launcher_s')})  {j['cost']:6d} chars  {j['name']}")
    if profile:
        print(f"   sampled main thread every {profile['interval_ms']} ms, {profile['n']} samples; inclusive ms:")
        for k, v in profile["inclusive_ms"][:30]:
            print(f"     {v:6d}  {k}")
        print("   own ms:")
        for k, v in profile["own_ms"][:15]:
            print(f"     {v:6d}  {k}")
        print("   timeline (half seconds: innermost ember function, ms):")
        for b, top in profile["timeline"]:
            print(f"     {b:5.1f}  " + "; ".join(f"{k} {v}" for k, v in top))


if __name__ == "__main__":
    main()
