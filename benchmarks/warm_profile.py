"""Where the warm first call's time goes (issue 29: "a process whose compile caches are warm reaches its
first result with no tracing, bounded by loading").

    python benchmarks/warm_profile.py --device cuda --workloads gpt2_infer,gpt2_train
    python benchmarks/warm_profile.py --device cpu --workloads gpt2_infer --shape 1,64   # CPU: fewer tokens
    python benchmarks/warm_profile.py --device cpu --quick                                # tiny model

Per workload (``compile_time.py``'s rows, same models): a first process compiles with empty caches
(``EMBER_CACHE_DIR`` + ``TRITON_CACHE_DIR`` in a temporary directory, or ``--cache-dir``), a second
one finds them warm and profiles its first call (imports excluded, as in compile_time.py). It prints:

* ``first``: wrapping the model and the first result (compile_time.py's warm ``compile_s``);
* ``steady``: the same step once more (what running costs), and ``eager``: the uncompiled step, so
  ``first - steady`` is what loading costs; a third process times eager's own first step, which
  pays CUDA's context, cuBLAS and the first kernels' loading too (the part of ``first`` not ours);
* spans: cumulative seconds of the named phases (frontend cache, aot cache, native kernels...) from
  cProfile, then the most expensive ember functions (cumulative and own time).

``--no-profile`` times without cProfile (its overhead is ~1.5-2x on Python-heavy code).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# (label, file suffix, function name): cumulative time of each in the warm first call
SPANS = (
    ("frontend: cache key", "ember/frontend/persist.py", "key_of"),
    ("frontend: load entry", "ember/frontend/persist.py", "load"),
    ("frontend: rebuild graph", "ember/frontend/persist.py", "rebuild_graph"),
    ("frontend: install entry", "ember/frontend/persist.py", "_install"),
    ("frontend: trace (should be 0)", "ember/frontend/convert.py", "_compile"),
    ("aot: cache key", "ember/aot/cache.py", "key_of"),
    ("aot: load", "ember/aot/cache.py", "load"),
    ("aot: rebuild graph", "ember/aot/cache.py", "rebuild_graph"),
    ("native: compile_aten_graph", "ember/native/backend.py", "compile_aten_graph"),
    ("native: load kernels", "ember/native/cache.py", "load_module"),
    ("native: plan (should be 0)", "ember/native/backend.py", "plan"),
    ("native: precompile launches", "ember/native/runtime.py", "precompile"),
    ("native: cuda prewarm join", "ember/native/runtime.py", "prewarm_cuda"),
    ("triton: compile (disk cache hits)", "triton/compiler/compiler.py", "compile"),
    ("triton: launcher", "triton/backends/nvidia/driver.py", "__init__"),
    ("cuda: lazy init", "torch/cuda/__init__.py", "_lazy_init"),
    ("make_fx (should be 0)", "torch/fx/experimental/proxy_tensor.py", "wrapped"),
    ("torch.autograd.backward", "torch/autograd/__init__.py", "backward"),
    ("optimizer step", "torch/optim/optimizer.py", "wrapper"),
)


def child(row: str, dev: str, quick: bool, shape, profile: bool, top: int, callers: str | None = None,
          eager_only: bool = False) -> dict:
    import importlib
    from compile_time import COMPILER_MODULES, SHARED, compiler_fn, make
    for m in (*SHARED, "transformers", *COMPILER_MODULES["ember"]):
        try:
            importlib.import_module(m)
        except ImportError:
            pass
    import torch
    cuda = dev.startswith("cuda")
    if not cuda:
        torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = True

    def sync():
        if cuda:
            torch.cuda.synchronize()
    torch.manual_seed(0)
    build, inputs = make(row, dev, quick)
    if shape is not None:  # fewer tokens: the same model, less running
        inputs = (torch.randint(0, 100, shape, device=dev),)
    if eager_only:  # a fresh process's first eager step: what eager pays too (CUDA/cuBLAS init, first kernels)
        step = build(lambda f: f)
        t0 = time.perf_counter()
        step(*inputs)
        sync()
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
        step(*inputs)
        sync()
        return dict(row=row, eager_first_s=round(first, 4), eager_steady_s=round(time.perf_counter() - t1, 4))
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    before = set(sys.modules)
    step = build(compiler_fn("ember"))
    step(*inputs)
    sync()
    if prof:
        prof.disable()
    first = time.perf_counter() - t0
    imported = sorted(m for m in set(sys.modules) - before if not m.startswith("__"))
    t1 = time.perf_counter()
    step(*inputs)
    sync()
    steady = time.perf_counter() - t1
    eager_step = build(lambda f: f)
    t2 = time.perf_counter()
    eager_step(*inputs)
    sync()
    eager = time.perf_counter() - t2
    from ember.diagnostics import counters
    from ember.aot import deferred
    from ember.cudagraphs import auto
    from ember.native import cache as native_cache
    rec = dict(row=row, first_s=round(first, 4), steady_s=round(steady, 4), eager_s=round(eager, 4),
               frames_traced=counters.COMPILES["frames_compiled"], frames_loaded=counters.COMPILES["frames_loaded"],
               imported_in_first_call=imported,
               # a warm start builds none of the cached aot graphs (auto CUDA graphs decide from stored facts)
               aot_graphs=dict(deferred.STATS),
               # generated modules imported: wrappers, and kernel modules only where a launch needed the function
               native_modules=len({k for k in native_cache._MODULES if isinstance(k, tuple)}),
               auto_cudagraphs=[list(d) for d in auto.DECISIONS])
    if prof:
        rec["spans"], rec["top_cum"], rec["top_own"] = _report(prof, top)
        if callers:
            import io
            import pstats
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_callers(callers)
            rec["callers"] = buf.getvalue()[-6000:]
    return rec


def _report(prof, top: int):
    import pstats
    st = pstats.Stats(prof).stats  # (file, line, fn) -> (cc, nc, tt, ct, callers)
    spans = {}
    for label, suffix, name in SPANS:
        ct = sum(v[3] for (f, _, fn), v in st.items() if f.endswith(suffix) and fn == name)
        if ct:
            spans[label] = round(ct, 4)
    ours = [(k, v) for k, v in st.items() if "/ember/" in k[0]]
    def short(k):
        where = k[0].split("/ember/")[-1] if "/ember/" in k[0] else k[0].split("site-packages/")[-1]
        return f"{where}:{k[1]}:{k[2]}"
    top_cum = [(short(k), round(v[3], 4), v[1]) for k, v in sorted(ours, key=lambda kv: -kv[1][3])[:top]]
    top_own = [(short(k), round(v[2], 4), v[1]) for k, v in sorted(st.items(), key=lambda kv: -kv[1][2])[:top]]
    return spans, top_cum, top_own


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--workloads", default="gpt2_infer,gpt2_train")
    p.add_argument("--quick", action="store_true", help="tiny models")
    p.add_argument("--shape", default=None, help="input ids B,S instead of the row's (gpt2 rows)")
    p.add_argument("--cache-dir", default=None, help="keep the caches here (an existing one is reused warm)")
    p.add_argument("--no-profile", action="store_true", help="time without cProfile")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--callers", default=None, help="also print who calls functions matching this (pstats) pattern")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--eager-only", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    shape = tuple(int(x) for x in a.shape.split(",")) if a.shape else None
    if a.child:
        rec = child(a.child, a.device, a.quick, shape, a.profile, a.top, a.callers, a.eager_only)
        print("RESULT " + json.dumps(rec), flush=True)
        return 0
    from gpu_suite import child_env
    tmp = tempfile.mkdtemp(prefix="warm_profile_")
    # Python's bytecode cache lives with the compile caches: a warm process finds both, as the
    # second process of compile_time.py does
    env = child_env(a.cache_dir or tmp)
    try:
        for row in a.workloads.split(","):
            base = os.path.join(a.cache_dir or tmp, row)
            env_row = dict(env, EMBER_CACHE_DIR=os.path.join(base, "ember"),
                           TRITON_CACHE_DIR=os.path.join(base, "triton"))
            cmd = [sys.executable, os.path.abspath(__file__), "--child", row, "--device", a.device, "--top", str(a.top)]
            cmd += (["--quick"] if a.quick else []) + (["--shape", a.shape] if a.shape else [])
            cmd += ["--callers", a.callers] if a.callers else []
            phases = ["warm"] if os.path.isdir(os.path.join(base, "ember")) else ["cold", "warm"]
            for phase in ["eager", *phases]:
                extra = ["--profile"] if phase == "warm" and not a.no_profile else []
                extra += ["--eager-only"] if phase == "eager" else []
                r = subprocess.run(cmd + extra, env=env_row, cwd=ROOT, capture_output=True, text=True,
                                   timeout=a.timeout)
                line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
                if line is None:
                    print(f"{row} {phase}: failed\n{r.stderr[-3000:]}")
                    break
                _print(phase, json.loads(line[7:]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _print(phase: str, rec: dict) -> None:
    if phase == "eager":
        print(f"{rec['row']} eager in a fresh process: first step {rec['eager_first_s']:.3f} s, then "
              f"{rec['eager_steady_s']:.3f} s (first - then: what eager pays at start, CUDA/cuBLAS init included)")
        return
    print(f"{rec['row']} {phase}: first {rec['first_s']:.3f} s, steady {rec['steady_s']:.3f} s, eager "
          f"{rec['eager_s']:.3f} s, frames traced {rec['frames_traced']}, loaded {rec['frames_loaded']}")
    if "aot_graphs" in rec:
        print(f"  aot graphs loaded unbuilt {rec['aot_graphs']['deferred']}, built {rec['aot_graphs']['materialized']}; "
              f"native modules imported {rec['native_modules']}")
        for name, replay, why in rec["auto_cudagraphs"]:
            print(f"  auto cudagraphs {name}: {'replays' if replay else 'runs as compiled'}: {why}")
    if rec.get("imported_in_first_call"):
        print(f"  modules first imported during the first call: {', '.join(rec['imported_in_first_call'])}")
    if "spans" not in rec:
        return
    print("  spans (cumulative s, under cProfile):")
    for k, v in rec["spans"].items():
        print(f"    {k:<34} {v:8.4f}")
    print("  ember functions by cumulative s (calls):")
    for name, s, n in rec["top_cum"]:
        print(f"    {s:8.4f} {n:6d}  {name}")
    print("  all functions by own s (calls):")
    for name, s, n in rec["top_own"]:
        print(f"    {s:8.4f} {n:6d}  {name}")
    if rec.get("callers"):
        print(rec["callers"])


if __name__ == "__main__":
    sys.exit(main())
