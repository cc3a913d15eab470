"""Start-up time of a compiled model: cold compile, warm cache and an AOT package, ember vs torch.

    python benchmarks/startup.py                       # small GPT-2 on CPU (transformers), ~3-6 minutes
    python benchmarks/startup.py --device cuda --size full   # GPT-2 (124M) on a GPU
    python benchmarks/startup.py --model mlp           # no transformers needed

Variants, each in its own fresh process (so nothing is shared but the on-disk caches named here):

  ember:cold           ember.compile(model) with an empty ember cache (and an empty Triton cache)
  ember:warm           the same, in a second process that finds the cache of the cold run
  ember:aot            ember.export.aot_load of a package written beforehand by ember.export.aot_compile
  torch.compile:cold   torch.compile(model) with an empty Inductor/Triton cache
  torch.compile:warm   the same, in a second process that finds that cache
  aoti                 torch._inductor.aoti_load_package of a package from aoti_compile_and_package
                       (where it runs: it needs a C++ compiler; a failure is reported as skipped)
  weights              the floor every deployment pays: import torch, load the state dict (mapped)
                       and move it to the device; no model code, no call

The ember package is exported with a dynamic batch (``Dim("batch", max=32)``): one package for
every batch size, as a server needs. The ember:aot row also says how its kernels were loaded
(``kernels_loaded``: straight from the packaged binaries; ``kernels_jit``: through Triton's JIT
finding them in the packaged cache) and ``aot_overhead_s``: its load + first call minus the
weights row's load (the start-up target: at most 0.5 s for GPT-2 on an H100).

Each process reports separately: ``import_s`` (import torch and the library the variant needs),
``load_s`` (build the model and move its weights, or load the package), ``first_call_s`` (the first
call: compile + run for ember/torch.compile, run only for packages), and ``steady_ms`` (median of
later calls). ``total_s`` is their sum: the time from an empty process to the first result.
The packages are built in a setup process beforehand (their build time is ``build_s``).

Writes benchmarks/results/startup-<device>.json and prints a table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)  # run from a checkout without installing
sys.path.insert(0, HERE)

VARIANTS = ("ember:cold", "ember:warm", "ember:aot", "torch.compile:cold", "torch.compile:warm", "aoti", "weights")


# ------------------------------------------------------------------------------------------ models

def build(model: str, size: str, device: str):
    """(module in eval mode on device, example args)."""
    import torch

    torch.manual_seed(0)
    if model == "gpt2":
        import transformers as tf
        cfg = (tf.GPT2Config(use_cache=False) if size == "full" else
               tf.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=128, use_cache=False))
        m = tf.GPT2Model(cfg)
        # batch 2: the package's batch is a Dim, whose range starts at 2 (a 1 would be specialized)
        args = (torch.randint(0, cfg.vocab_size, (2, 64 if size == "full" else 32), device=device),)
    elif model == "mlp":
        width = 1024 if size == "full" else 256
        layers = []
        for _ in range(8):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        m = torch.nn.Sequential(*layers)
        args = (torch.randn(8, width, device=device),)
    else:
        raise SystemExit(f"unknown model {model!r}: gpt2 or mlp")
    return m.eval().to(device), args


def _first_tensor(out):
    import torch
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0] if isinstance(out, (tuple, list)) else out


def _sync(device):
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------ children

def child(variant: str, a) -> dict:
    t0 = time.perf_counter()
    import torch
    if variant.startswith("ember:") and variant != "ember:aot":
        import ember
    elif variant == "ember:aot":
        from ember.export.aot_runtime import aot_load
    elif variant == "aoti":
        from torch._inductor import aoti_load_package
    if a.model == "gpt2" and variant in ("ember:aot", "aoti"):
        import transformers.modeling_outputs  # noqa: F401 - the output classes' pytree registration
    t1 = time.perf_counter()
    if variant == "weights":
        state = torch.load(os.path.join(a.work, "state.pt"), mmap=True, weights_only=True)
        state = {k: v.to(a.device) for k, v in state.items()}
        _sync(a.device)
        t2 = time.perf_counter()
        return dict(variant=variant, status="ok", import_s=round(t1 - t0, 3), load_s=round(t2 - t1, 3),
                    first_call_s=0.0, steady_ms=0.0, total_s=round(t2 - t0, 3), matches_eager=None)
    if variant == "ember:aot":
        run = aot_load(a.package)
        args = _package_args(a)
    elif variant == "aoti":
        run = aoti_load_package(a.package)
        args = _package_args(a)
    else:
        model, args = build(a.model, a.size, a.device)
        run = (ember.compile(model) if variant.startswith("ember:") else torch.compile(model))
    _sync(a.device)
    t2 = time.perf_counter()
    with torch.no_grad():
        out = run(*args)
        _sync(a.device)
        t3 = time.perf_counter()
        times = []
        for _ in range(a.iters):
            s = time.perf_counter()
            run(*args)
            _sync(a.device)
            times.append(time.perf_counter() - s)
    ok = None
    if a.reference:
        ref = torch.load(a.reference)
        ok = bool(torch.allclose(_first_tensor(out).float().cpu(), ref, rtol=1e-3, atol=1e-3))
    row = dict(variant=variant, status="ok", import_s=round(t1 - t0, 3), load_s=round(t2 - t1, 3),
               first_call_s=round(t3 - t2, 3), steady_ms=round(statistics.median(times) * 1e3, 3),
               total_s=round(t3 - t0, 3), matches_eager=ok)
    if variant == "ember:aot":
        native = getattr(run._run, "ember_aot", None) or {}
        row.update(renderer=native.get("renderer", "aten"), kernels_loaded=native.get("kernels_loaded", 0),
                   kernels_jit=native.get("kernels_jit", 0), kernel_load_note=native.get("reason"))
        row["heavy_modules"] = sorted(m for m in sys.modules if m.startswith(
            ("ember.frontend", "ember.aot", "ember.native.lowering", "ember.native.backend", "torch._dynamo")))
    return row


def _package_args(a):
    import torch
    return torch.load(a.inputs, map_location=a.device)


def setup(a) -> dict:
    """Build the eager reference, the ember AOT package and the AOTInductor package."""
    import torch
    import ember.export as ee

    model, args = build(a.model, a.size, a.device)
    with torch.no_grad():
        torch.save(_first_tensor(model(*args)).float().cpu(), os.path.join(a.work, "reference.pt"))
    torch.save(args, os.path.join(a.work, "inputs.pt"))
    torch.save(model.state_dict(), os.path.join(a.work, "state.pt"))
    out = {}
    t = time.perf_counter()
    # one package for every batch size up to 32 (the batch stays a kernel argument)
    first = "input_ids" if a.model == "gpt2" else "input"
    ep = ee.export(model, args, dynamic_shapes={first: {0: ee.Dim("batch", max=32)}})
    ee.aot_compile(ep, os.path.join(a.work, "model.ember"), device=a.device)
    out["ember:aot"] = round(time.perf_counter() - t, 2)
    if "aoti" not in a.variants.split(","):
        return out
    try:
        from torch._inductor import aoti_compile_and_package  # benchmarks may use the peer
        t = time.perf_counter()
        ep_t = torch.export.export(model, args)  # the peer's own capture, for the peer's package
        aoti_compile_and_package(ep_t, package_path=os.path.join(a.work, "model_aoti.pt2"))
        out["aoti"] = round(time.perf_counter() - t, 2)
    except Exception as e:  # noqa: BLE001 - no compiler etc.: the variant is skipped
        out["aoti_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return out


# ------------------------------------------------------------------------------------------ driver

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2", choices=("gpt2", "mlp"))
    p.add_argument("--size", default="small", choices=("small", "full"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--setup", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    p.add_argument("--package", default=None, help=argparse.SUPPRESS)
    p.add_argument("--inputs", default=None, help=argparse.SUPPRESS)
    p.add_argument("--reference", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.setup:
        print("RESULT " + json.dumps(setup(a)), flush=True)
        return
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a)), flush=True)
        return

    from _proc import run_measured

    work = tempfile.mkdtemp(prefix="ember_startup_")
    caches = {k: os.path.join(work, k) for k in ("ember", "triton_ember", "inductor", "triton_torch", "setup")}
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    common = [sys.executable, os.path.abspath(__file__), "--model", a.model, "--size", a.size, "--device", a.device,
              "--iters", str(a.iters), "--work", work]
    setup_env = dict(env, EMBER_CACHE_DIR=caches["setup"], TORCHINDUCTOR_CACHE_DIR=caches["setup"] + "_ind",
                     TRITON_CACHE_DIR=caches["setup"] + "_triton")
    built = run_measured(common + ["--setup", "--variants", a.variants], setup_env, REPO, 3600, {"status": "failed"})
    print(f"setup: {built}", flush=True)
    rows = []
    for variant in a.variants.split(","):
        venv = dict(env)
        if variant.startswith("ember"):
            venv.update(EMBER_CACHE_DIR=caches["ember"], TRITON_CACHE_DIR=caches["triton_ember"])
        else:
            venv.update(TORCHINDUCTOR_CACHE_DIR=caches["inductor"], TRITON_CACHE_DIR=caches["triton_torch"])
        extra = ["--reference", os.path.join(work, "reference.pt"), "--inputs", os.path.join(work, "inputs.pt")]
        if variant == "ember:aot":
            extra += ["--package", os.path.join(work, "model.ember")]
        if variant == "aoti":
            if "aoti" not in built:
                rows.append(dict(variant=variant, status="skipped", error=built.get("aoti_error", "not built")))
                continue
            extra += ["--package", os.path.join(work, "model_aoti.pt2")]
        row = run_measured(common + ["--child", variant] + extra, venv, REPO, 3600, {"variant": variant})
        if variant in built:
            row["build_s"] = built[variant]
        rows.append(row)
        print(_line(row), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    by = {r["variant"]: r for r in rows if r.get("status") == "ok"}
    if "ember:aot" in by and "weights" in by:
        aot = by["ember:aot"]
        aot["aot_overhead_s"] = round(aot["load_s"] + aot["first_call_s"] - by["weights"]["load_s"], 3)
        print(f"ember:aot load + first call beyond moving the weights: {aot['aot_overhead_s']:.3f} s "
              f"({aot.get('renderer')} package; Triton kernels from binaries {aot.get('kernels_loaded')}, through "
              f"Triton's JIT {aot.get('kernels_jit')}"
              f"{'; ' + aot['kernel_load_note'] if aot.get('kernel_load_note') else ''}; heavy modules "
              f"{aot.get('heavy_modules')})", flush=True)

    import torch
    dev_name = torch.cuda.get_device_name() if a.device == "cuda" and torch.cuda.is_available() else platform.processor() or "cpu"
    result = dict(benchmark="startup", date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  model=a.model, size=a.size, device=a.device, device_name=dev_name, torch=torch.__version__,
                  python=platform.python_version(), iters=a.iters, rows=rows,
                  # a shared machine's load skews every number: read them against it
                  loadavg_1m=round(os.getloadavg()[0], 2), cpus=os.cpu_count())
    out = a.out or os.path.join(HERE, "results", f"startup-{a.device}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {out}")


def _line(r: dict) -> str:
    if r.get("status") != "ok":
        return f"{r['variant']:<20} {r.get('status')}: {r.get('error', '')}"
    return (f"{r['variant']:<20} import {r['import_s']:7.3f} s  load {r['load_s']:7.3f} s  first call "
            f"{r['first_call_s']:8.3f} s  total {r['total_s']:8.3f} s  steady {r['steady_ms']:9.3f} ms  "
            f"matches eager: {r['matches_eager']}")


if __name__ == "__main__":
    main()
