"""Where a cold ember compile spends its time: cProfile of one workload's first call (issue 29).

    python benchmarks/compile_profile.py --device cuda --workload llama_train            # the 1B Llama
    python benchmarks/compile_profile.py --device cuda --workload llama_infer --regional off
    python benchmarks/compile_profile.py --device cpu --workload llama_train --layers 24 --small   # laptop
    python benchmarks/compile_profile.py --device cuda --workload gpt2_train             # gpu_suite rows

One fresh process per run, with empty ember and Triton caches (``compile_time.py``'s cold phase),
imports excluded. The first call (compile + first run) runs under cProfile; printed: the wall and
CPU time of that call, the phases below (cumulative seconds of the function that is each phase; a
phase nested in another is part of it), and the top functions by cumulative and by own time. The
``.prof`` file goes next to ``--out`` (``python -m pstats`` reads it). cProfile slows Python about
1.5-2x, evenly enough that the shares are right; Triton builds run in worker processes (not
profiled): the main process waits for them in ``build_pool``.

``--regional``: ``auto`` (the default: ember's automatic choice), ``on`` or ``off`` (whole-graph);
``--layers``: the Llama's depth (default 24); ``--small``: the Llama at tiny widths (hidden 64; runs
on a laptop CPU, where the native backend emits C++ instead of Triton).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# phase -> (file suffix, function name): the function whose cumulative time is the phase
PHASES = {
    "frontend: trace bytecode + backend": ("ember/frontend/convert.py", "_compile"),
    "backend (all graphs)": ("ember/frontend/convert.py", "_finish"),
    "regional: split": ("ember/backends/regional.py", "split_regions"),
    "regional: part compiles (lazy, first run)": ("ember/backends/regional.py", "shared_compile"),
    "aot: build variant": ("ember/aot/pipeline.py", "build_variant"),
    "aot: trace fw+bw (make_fx)": ("ember/aot/trace.py", "trace_joint"),
    "aot: native compile of parts": ("ember/aot/pipeline.py", "_compile_parts"),
    "native: plan (lower+schedule+emit)": ("ember/native/backend.py", "plan"),
    "native: lowering": ("ember/native/lowering.py", "lower"),
    "native: scheduling": ("ember/native/scheduler.py", "schedule"),
    "native: Triton first launches (build wait + load)": ("ember/native/runtime.py", "_first_locked"),
    "native: wait for kernel builds": ("ember/native/build_pool.py", "wait"),
    "native: C++ library builds (cpu)": ("ember/native/cpp_build.py", "library"),
    "autograd backward (first)": ("torch/autograd/graph.py", "_engine_run_backward"),
}


def child(a) -> dict:
    import torch
    cuda = a.device.startswith("cuda")
    if not cuda:
        torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = True
    import ember  # noqa: F401  (imports excluded from the profile)
    import ember.aot  # noqa: F401
    import ember.native.backend  # noqa: F401
    if a.regional != "auto":
        ember.config.regional_compile = a.regional == "on"
        if a.regional == "off":
            ember.config.regional_auto_block_params = 0
    from compile_time import compiler_fn, llama, make
    torch.manual_seed(0)
    if a.workload.startswith("llama"):
        build, inputs = llama(a.device, a.small, a.workload == "llama_train", layers=a.layers)
    else:
        build, inputs = make(a.workload, a.device, a.small)
    if cuda:
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    step = build(compiler_fn("ember"))
    step(*inputs)
    if cuda:
        torch.cuda.synchronize()
    prof.disable()
    row = dict(workload=a.workload, layers=a.layers, regional=a.regional, device=a.device,
               first_call_s=round(time.perf_counter() - t0, 3), first_call_cpu_s=round(time.process_time() - c0, 3))
    prof.dump_stats(a.prof)
    st = pstats.Stats(prof)
    phases = {}
    for name, (path, fn) in PHASES.items():
        hits = [v for k, v in st.stats.items() if k[0].replace(os.sep, "/").endswith(path) and k[2] == fn]
        if hits:
            phases[name] = round(max(v[3] for v in hits), 3)  # (recursive entries: the outermost)
    row["phases_s"] = phases
    from ember.backends import regional
    row["regional_stats"] = dict(regional.stats())

    def top(key: int, n: int = 25) -> list:
        rows = sorted(st.stats.items(), key=lambda kv: -kv[1][key])[:n]
        return [(f"{os.path.relpath(k[0], ROOT) if k[0].startswith(ROOT) else k[0].split('site-packages/')[-1]}:"
                 f"{k[1]}({k[2]})", v[1], round(v[2], 3), round(v[3], 3)) for k, v in rows]
    row["top_cumulative"] = top(3)
    row["top_own"] = top(2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workload", default="llama_train", help="llama_infer, llama_train or a gpu_suite row")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--small", action="store_true", help="tiny widths (the suites' --quick shapes)")
    ap.add_argument("--regional", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--out", default=None, help="JSON of the run (default: print only)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prof", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a)), flush=True)
        return
    from gpu_suite import child_env
    with tempfile.TemporaryDirectory(prefix="ember-compile-profile-") as tmp:
        env = child_env(tmp)
        env.update(EMBER_CACHE_DIR=os.path.join(tmp, "ember"), TRITON_CACHE_DIR=os.path.join(tmp, "triton"))
        prof = (os.path.splitext(a.out)[0] + ".prof") if a.out else os.path.join(tmp, "compile.prof")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--device", a.device, "--workload", a.workload,
               "--layers", str(a.layers), "--regional", a.regional, "--prof", prof] + (["--small"] if a.small else [])
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=a.timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        sys.exit(f"child failed (rc {p.returncode}):\n{(p.stderr or p.stdout)[-3000:]}")
    row = json.loads(lines[-1][len("RESULT "):])
    print(f"{row['workload']} ({row['layers']} layers, regional {row['regional']}, {row['device']}): first call "
          f"{row['first_call_s']} s wall, {row['first_call_cpu_s']} s CPU (under cProfile); regional {row['regional_stats']}")
    print("\nphase                                        cumulative s")
    for name, s in row["phases_s"].items():
        print(f"  {name:<42} {s:8.3f}")
    for title, key in (("by cumulative time", "top_cumulative"), ("by own time", "top_own")):
        print(f"\ntop functions {title}: (calls, own s, cumulative s)")
        for fn, calls, own, cum in row[key]:
            print(f"  {calls:>9} {own:8.3f} {cum:8.3f}  {fn}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(row, f, indent=1)
        print(f"\nwrote {a.out} and {prof}")


if __name__ == "__main__":
    main()
