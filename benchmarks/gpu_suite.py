"""The GPU suite: ten workloads, each run as eager, ember and torch.compile, against the peer numbers
of docs ``peers-h100.md`` (same workloads and timing method as the peer harness ``peer_bench.py``).

    python benchmarks/gpu_suite.py                          # all ten, mode default (~8 min on an H100)
    python benchmarks/gpu_suite.py --mode reduce-overhead   # or max-autotune, max-autotune-no-cudagraphs
    python benchmarks/gpu_suite.py --workloads softmax,gpt2_infer --timeout 300
    python benchmarks/gpu_suite.py --quick --device cpu     # tiny shapes: a smoke test of the harness

Workloads: overhead (x*2+1 on 16 floats), mlp (3 Linear+GELU, batch 32), ln_gelu (layer_norm+gelu
8192x4096 bf16), softmax (8192x8192 fp32), gpt2_infer (124M, b8x512 bf16), gpt2_train (autocast
bf16, fused AdamW), bert_infer (base, b16x256 bf16), resnet50_infer (b64 bf16 channels_last),
resnet50_train (autocast bf16, SGD), vit_infer (timm vit_base_patch16_224, b64 bf16), sd15_unet
(one denoising step of Stable Diffusion 1.5: its UNet, 860M parameters, random weights, fp16,
batch 2 = one prompt with classifier-free guidance, 64x64 latents = 512x512 images, 77 text tokens;
needs diffusers; its ms column is ms per denoising step), tiny_hf (a 2-layer BertModel of hidden size
64 from a config, fp32, batch 2 x 64 tokens: a host-bound small model; outside the geomean).

    python benchmarks/gpu_suite.py --max-autotune             # + ember and torch.compile in max-autotune
    python benchmarks/gpu_suite.py --compilers eager,ember,ember-warm,ember-warm2,torch

Beyond time, per row: FLOPs of one step (counted once on the eager step by torch's FlopCounterMode)
and each compiler's TFLOP/s against the device's measured bf16 matmul rate, GB/s against its measured
copy bandwidth for the memory-bound rows (both measured in the same run, ``_gpu_metrics.py``), and
the peak of ``torch.cuda.max_memory_allocated`` over the timed steady loops (``peak_GB``; compile
and first call: ``first_peak_GB``). ember-warm and ember-warm2 are a second and a third process on
the cold ember process's caches, timed like it (``ember_warm_vs_cold``: their steady time over the
compiling process's). ``ember_cudagraph_decisions`` and ``ember_warm_cudagraph_decisions``: each
process's automatic CUDA-graph decisions in default mode, [graph, replayed?, why] (a graph decided by
timing its first calls says "measured" and gives the host and device times).

Method. Every (workload, compiler) runs in its own process with fresh caches, so the first call is
a true cold compile: ember gets a new ``EMBER_CACHE_DIR`` and ``TRITON_CACHE_DIR``, torch.compile a
new ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``. Python's own bytecode cache is shared and
warmed up first (``child_env``), as on any installed system. A second ember process then reuses the
first one's caches: its first call is the warm compile. Steady time: a Python loop of N calls between
two CUDA events, median of 5 loops (CPU-side overhead counts, as it does for users). Error: max
absolute difference from eager in the same process (training: the first step's loss, from an
identical twin model, both first steps after the same seed). Processes run ``--jobs`` at a time;
only one at a time holds the device (model, reference, compile, timing), so they overlap only
their imports. ``--merge`` keeps the other workloads' results of an earlier run in the same file
(a long serial run split over several invocations).

With CUDA graphs (reduce-overhead, max-autotune) the capture happens at the second call, so it is
not part of the compile time shown. ``--budget`` bounds the whole run (processes that would start
too late are skipped), and the JSON is rewritten after every process, so a run that is cut short
still leaves its results.

Writes ``benchmarks/results/gpu_suite-<device>[-<mode>].json`` and prints a markdown table with
geometric-mean speedups. Exits 1 if an ember run failed or differs from eager beyond tolerance.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from _proc import exclusive_lock, run_measured  # noqa: E402
from _gpu_metrics import achieved, count_flops, device_peaks, loop_times  # noqa: E402
WORKLOADS = ("overhead", "mlp", "ln_gelu", "softmax", "gpt2_infer", "gpt2_train", "bert_infer",
             "resnet50_infer", "resnet50_train", "vit_infer", "sd15_unet", "tiny_hf")
EXTRA_ROWS = ("tiny_hf",)  # not in the geomean (which stays the original rows')
# ember-warm / ember-warm2: a second and a third process on the first one's caches, timed like it;
# *-max-autotune: the compiler in mode max-autotune whatever --mode says (--max-autotune adds them)
COMPILERS = ("eager", "ember", "ember-warm", "ember-warm2", "torch", "ember-max-autotune", "torch-max-autotune")
DEFAULT_COMPILERS = ("eager", "ember", "ember-warm", "torch")
MAX_AUTOTUNE = ("ember-max-autotune", "torch-max-autotune")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# rough cost order (longest first), so parallel jobs finish together
ORDER = ("sd15_unet", "resnet50_train", "gpt2_train", "bert_infer", "gpt2_infer", "resnet50_infer", "vit_infer", "softmax",
         "ln_gelu", "tiny_hf", "mlp", "overhead")
# relative error (max |out - eager| / max |eager|) above which a result is flagged
TOL = {"overhead": 1e-5, "mlp": 1e-3, "softmax": 1e-4}
TOL_DEFAULT = 5e-2  # bf16 workloads


# ------------------------------------------------------------------------------------------ workloads

def _inference(model, inputs, pick=lambda out: out):
    """(build, inputs, None) for a model called under no_grad; ``pick`` selects the output tensor."""
    import torch

    def build(c):
        cm = c(model)

        def step(*args):
            with torch.no_grad():
                return pick(cm(*args))
        return step
    return build, inputs, None


def _training(model, opt, dev, inputs, loss_of):
    """(build, inputs, None) for one training step: ``loss_of(compiled, *inputs)`` under bf16
    autocast, backward, optimizer step; the step returns the detached loss."""
    import torch

    def build(c):
        cm = c(model)

        def step(*args):
            with torch.autocast(dev.split(":")[0], dtype=torch.bfloat16):
                loss = loss_of(cm, *args)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        return step
    return build, inputs, None


def make(wl: str, dev: str, quick: bool):
    """(build(compiler) -> step, inputs, bytes moved or None), as peer_bench.py defines them
    (``quick``: tiny shapes for a smoke run)."""
    import torch

    if wl == "overhead":
        x = torch.randn(16, device=dev)

        def f(x):
            return x * 2 + 1
        return (lambda c: c(f)), (x,), None
    if wl == "mlp":
        d0, d1, b = (64, 128, 4) if quick else (512, 1024, 32)
        m = torch.nn.Sequential(torch.nn.Linear(d0, d1), torch.nn.GELU(), torch.nn.Linear(d1, d1), torch.nn.GELU(),
                                torch.nn.Linear(d1, 10)).to(dev).eval()
        x = torch.randn(b, d0, device=dev)

        def build(c):
            cm = c(m)
            return lambda x: cm(x)
        return build, (x,), None
    if wl == "ln_gelu":
        r, n = (64, 256) if quick else (8192, 4096)
        x = torch.randn(r, n, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, device=dev, dtype=torch.bfloat16)

        def f(x, w, b):
            return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (n,), w, b))
        return (lambda c: c(f)), (x, w, b), 2 * x.numel() * 2
    if wl == "softmax":
        n = 256 if quick else 8192
        x = torch.randn(n, n, device=dev, dtype=torch.float32)

        def f(x):
            return torch.softmax(x * 0.125, dim=-1)
        return (lambda c: c(f)), (x,), 2 * x.numel() * 4
    if wl.startswith("gpt2"):
        from transformers import GPT2Config, GPT2LMHeadModel
        if quick:
            cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
            shape = (2, 16)
        else:
            cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
            shape = (8, 512)
        cfg._attn_implementation = "sdpa"
        m = GPT2LMHeadModel(cfg).to(dev)
        ids = torch.randint(0, cfg.vocab_size, shape, device=dev)
        if wl == "gpt2_infer":
            return _inference(m.eval().to(torch.bfloat16), (ids,), lambda out: out.logits)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=dev.startswith("cuda"))
        return _training(m, opt, dev, (ids,), lambda cm, ids: cm(ids, labels=ids).loss)
    if wl.startswith("resnet50"):
        import torchvision
        m = (torchvision.models.resnet18(num_classes=10) if quick else torchvision.models.resnet50()).to(dev)
        m = m.to(memory_format=torch.channels_last)
        x = torch.randn(*((2, 3, 32, 32) if quick else (64, 3, 224, 224)), device=dev).to(memory_format=torch.channels_last)
        if wl == "resnet50_infer":
            return _inference(m.eval().to(torch.bfloat16), (x.to(torch.bfloat16),))
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        return _training(m, opt, dev, (x,), lambda cm, x: cm(x).float().logsumexp(-1).mean())
    if wl == "vit_infer":
        import timm
        kw = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4) if quick else {}
        m = timm.create_model("vit_base_patch16_224", pretrained=False, **kw).to(dev).eval().to(torch.bfloat16)
        x = torch.randn(2 if quick else 64, 3, 32 if quick else 224, 32 if quick else 224, device=dev, dtype=torch.bfloat16)
        return _inference(m, (x,))
    if wl == "sd15_unet":
        sys.path.insert(0, ROOT)  # examples/ (the child's PYTHONPATH has it too; this is for imports from tests)
        from examples.stable_diffusion.tiny import sd15_unet, tiny_unet
        if quick:  # the tiny test UNet, fp32: a smoke run of the code path on a CPU
            unet, dtype, latent, text = tiny_unet().to(dev).eval(), torch.float32, 16, (16, 32)
        else:
            unet, dtype, latent, text = sd15_unet(torch.float16, dev), torch.float16, 64, (77, 768)
        x = torch.randn(2, 4, latent, latent, device=dev, dtype=dtype)
        t = torch.tensor(981, device=dev)  # a timestep tensor on the device, as the pipeline passes it
        emb = torch.randn(2, *text, device=dev, dtype=dtype)

        def build(c):
            cu = c(unet)

            def step(x, t, emb):  # the pipeline's call: return_dict=False, as diffusers advises for compiling
                with torch.no_grad():
                    return cu(x, t, encoder_hidden_states=emb, return_dict=False)[0]
            return step
        return build, (x, t, emb), None
    if wl == "tiny_hf":  # a small Hugging Face model (2 layers, hidden size 64), batch 2: host-bound
        from transformers import BertConfig, BertModel
        cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=256)
        cfg._attn_implementation = "sdpa"
        m = BertModel(cfg).to(dev).eval()
        ids = torch.randint(0, cfg.vocab_size, (2, 16 if quick else 64), device=dev)
        return _inference(m, (ids,), lambda out: out.last_hidden_state)
    if wl == "bert_infer":
        from transformers import BertConfig, BertModel
        if quick:
            cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                             vocab_size=128)
            shape = (2, 16)
        else:
            cfg, shape = BertConfig(), (16, 256)
        cfg._attn_implementation = "sdpa"
        m = BertModel(cfg).to(dev).eval().to(torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, shape, device=dev)
        return _inference(m, (ids,), lambda out: out.last_hidden_state)
    raise SystemExit(f"unknown workload {wl}")


def compiler_fn(compiler: str, mode: str):
    import torch
    if compiler.endswith("-max-autotune"):
        compiler, mode = compiler[:-len("-max-autotune")], "max-autotune"
    m = None if mode == "default" else mode
    if compiler == "eager":
        return lambda f: f
    if compiler.startswith("ember"):
        import ember
        return lambda f: ember.compile(f, mode=m)
    if compiler == "torch":
        return lambda f: torch.compile(f, mode=m)
    raise SystemExit(f"unknown compiler {compiler}")


def warm_step(wl: str, compiler: str, mode: str = "default", dev: str = "cuda", warmup: int = 6):
    """(step, inputs) for one workload and compiler, with measure()'s matmul precision settings,
    compiled and called ``warmup`` times: what the probes under benchmarks/probes time."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    build, inputs, _ = make(wl, dev, False)
    step = build(compiler_fn(compiler, mode))
    for _ in range(warmup):
        step(*inputs)
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    return step, inputs


# --------------------------------------------------------------------------------- one measured process



def measure(wl: str, compiler: str, mode: str, dev: str, quick: bool, timing: bool, lock: str | None) -> dict:
    import torch

    cuda = dev.startswith("cuda")
    if not cuda:  # one intra-op thread: on a small shared machine, thread contention swamps the timings
        torch.set_num_threads(1)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    training = wl.endswith("_train")
    # everything that touches the device holds the machine alone: parallel jobs overlap only their
    # imports. A compile beside a timed loop slows it (torch.compile's compile workers take every
    # core, its autotuning the GPU), and so does another process building a model or its reference
    with exclusive_lock(lock):
        torch.manual_seed(0)
        build, inputs, nbytes = make(wl, dev, quick)
        if training:  # the reference: the first step of an identical twin, run eagerly
            torch.manual_seed(0)
            twin_build, twin_inputs, _ = make(wl, dev, quick)
            torch.manual_seed(1)  # the same dropout masks for both first steps (if the compiler draws like eager)
            ref = twin_build(lambda f: f)(*twin_inputs)
            del twin_build, twin_inputs
        else:
            with torch.no_grad():
                ref = build(lambda f: f)(*inputs)
        sync()
        rec = _compile_and_time(wl, compiler, mode, build, inputs, ref, nbytes, quick, timing, cuda, sync)
    if compiler.startswith("ember"):
        rec["ember"] = ember_stats()
    return rec


def _compile_and_time(wl, compiler, mode, build, inputs, ref, nbytes, quick, timing, cuda, sync) -> dict:
    import torch
    # compile time as a user sees it: from wrapping the model to the first result (torch.compile
    # imports its compiler stack when wrapping, ember at the first call)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step = build(compiler_fn(compiler, mode))
    torch.manual_seed(1)
    out = step(*inputs)
    sync()
    first = time.perf_counter() - t0
    diff = (out.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item() or 1.0
    rec = dict(workload=wl, compiler=compiler, mode=mode, status="ok", first_call_s=round(first, 3),
               max_abs_err=diff, rel_err=diff / scale)
    if cuda:  # compile and first call (the reference model, built before, is in it too)
        rec["first_peak_GB"] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
    del out
    if timing:
        for _ in range(5):
            step(*inputs)
        sync()
        if cuda:  # the steady step's peak: weights, optimizer state, activations, the compiler's pools
            torch.cuda.reset_peak_memory_stats()
        iters = (50 if wl in ("overhead", "mlp") else 10) if quick else (200 if wl in ("overhead", "mlp") else 30)
        loops = 3 if quick else 5
        times = loop_times(lambda: step(*inputs), iters, loops, cuda)
        ms = statistics.median(times)
        rec.update(ms=round(ms, 4), ms_loops=[round(t, 4) for t in times], iters=iters)
        if cuda:
            rec["peak_GB"] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
        if compiler == "eager":  # FLOPs of one step, counted once on the eager step (after timing it)
            rec["flops"] = count_flops(step, inputs)
        if nbytes:
            rec["GBps"] = round(nbytes / (ms * 1e-3) / 1e9, 1)
            if compiler == "eager" and cuda:  # the ceiling: a plain device copy of the same bytes
                rec["copy_GBps"] = copy_bandwidth(inputs[0], iters, loops)
    return rec


def copy_bandwidth(x, iters: int, loops: int) -> float:
    """GB/s of ``y.copy_(x)`` (x read once, y written once), timed like the workloads."""
    import torch
    y = torch.empty_like(x)
    for _ in range(5):
        y.copy_(x)
    ms = statistics.median(loop_times(lambda: y.copy_(x), iters, loops, True))
    return round(2 * x.numel() * x.element_size() / (ms * 1e-3) / 1e9, 1)


def ember_stats() -> dict:
    out = {}
    try:  # launch paths (runtime.STATS), build workers, automatic CUDA graphs, cache hits
        from ember.aot import cache as aot_cache
        from ember.cudagraphs import auto
        from ember.native import backend, build_pool, runtime
        out["launch"] = dict(runtime.STATS)
        pool = build_pool.get()
        out["build_workers"] = len(pool.procs) if pool is not None else 0
        out["auto_cudagraphs"] = [f"{name}: {'replay' if r else 'no'}: {why}" for name, r, why in auto.DECISIONS][:8]
        # (graph, replayed?, why) of each automatic CUDA-graph decision, as the process ends: a measured
        # graph's entry carries its measured host and device times
        out["cudagraph_decisions"] = [[name, bool(r), why] for name, r, why in auto.DECISIONS][:32]
        out["aot_cache"] = dict(aot_cache.STATS)
        out["native_generated"] = dict(backend.COUNTERS)
    except Exception:  # noqa: BLE001 - stats are informative only
        pass
    try:
        import ember.cudagraphs as cg
        s = cg.stats()
        out["cudagraphs"] = {k: (len(v) if isinstance(v, list) else v) for k, v in s.items()}
        out["cudagraphs_disabled"] = s["disabled"][:5]
    except Exception:  # noqa: BLE001 - stats are informative only
        pass
    return out


# ------------------------------------------------------------------------------------------ the driver

def run_child(wl, compiler, args, env, timing=True) -> dict:
    base = dict(workload=wl, compiler=compiler, mode=args.mode)
    left = args.deadline - time.perf_counter()
    if left < 30:  # the whole run must end in time (a killed run would leave no results)
        return dict(base, status="skipped", error=f"out of the --budget of {args.budget:.0f} s")
    timeout = min(args.timeout, left)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", wl, compiler, "--mode", args.mode,
           "--device", args.device]
    if args.quick:
        cmd.append("--quick")
    if not timing:
        cmd.append("--no-timing")
    if args.lock:
        cmd += ["--lock", args.lock]
    return run_measured(cmd, env, ROOT, timeout, base)


# what a first compile imports, for either compiler (the warm-up below compiles their bytecode once)
WARM_IMPORTS = ("torch", "triton", "triton.language", "torch._dynamo", "torch._inductor.compile_fx", "ember",
                "ember.native.backend", "ember.aot", "torch.fx.experimental.symbolic_shapes", "transformers",
                "timm", "torchvision", "diffusers")


def child_env(tmp: str) -> dict:
    """The environment of every measured process: this one's, with the repository on the path and
    Python bytecode cached under ``tmp``, warmed up once here.

    Some machines (the H100 one of our runs) set ``PYTHONDONTWRITEBYTECODE``, so every process
    compiles every imported module from source: ~5 s for ember's imports and more for
    torch.compile's, counted as compile time. An installed package has its bytecode already, so the
    suite caches it in a shared prefix and imports both compilers' stacks once before measuring;
    each measured process still starts with empty compiler caches."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    code = "import importlib\nfor m in %r:\n    try:\n        importlib.import_module(m)\n    except ImportError:\n        pass" % (
        WARM_IMPORTS,)
    subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, timeout=600)
    return env


def run_workload(wl, args, compilers, log) -> list:
    out = []
    tmp = tempfile.mkdtemp(prefix=f"gpu_suite_{wl}_")
    try:
        def env_for(kind):
            env = dict(args.child_env)
            tag = kind.replace("-warm2", "").replace("-warm", "")  # (ember's warm runs share ember's caches)
            if kind.startswith("torch"):
                env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, f"inductor-{tag}")
                env["TRITON_CACHE_DIR"] = os.path.join(tmp, f"triton-{tag}")
            else:  # ember cold and warm share these: the warm runs find what the cold one wrote
                env["EMBER_CACHE_DIR"] = os.path.join(tmp, tag)
                env["TRITON_CACHE_DIR"] = os.path.join(tmp, f"triton-{tag}")
            return env
        for c in compilers:
            if c.startswith("ember-warm") and not any(r["compiler"] == "ember" and r["status"] == "ok" for r in out):
                rec = dict(workload=wl, compiler=c, mode=args.mode, status="skipped", error="no cold ember run")
            else:  # (warm runs are timed too: their steady time must equal the compiling process's)
                rec = run_child(wl, c, args, env_for(c))
            log(rec)
            out.append(rec)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def summarize(results: list, workloads, peaks: dict | None = None) -> tuple[list, dict]:
    by = {(r["workload"], r["compiler"]): r for r in results}
    rows = []
    for wl in workloads:
        extra = {}
        for c in COMPILERS:  # every compiler's time, peak memory and status, keyed by its name
            r = by.get((wl, c), {})
            k = c.replace("-", "_")
            extra.update({f"{k}_ms": r.get("ms"), f"{k}_peak_GB": r.get("peak_GB"), f"{k}_status": r.get("status", "missing")})
        e, m, w, t = (by.get((wl, c), {}) for c in ("eager", "ember", "ember-warm", "torch"))
        row = dict(workload=wl, eager_ms=e.get("ms"), ember_ms=m.get("ms"), torch_ms=t.get("ms"),
                   ember_cold_s=m.get("first_call_s"), ember_warm_s=w.get("first_call_s"),
                   torch_cold_s=t.get("first_call_s"), ember_err=m.get("max_abs_err"), torch_err=t.get("max_abs_err"),
                   ember_rel_err=m.get("rel_err"), eager_GBps=e.get("GBps"), ember_GBps=m.get("GBps"),
                   torch_GBps=t.get("GBps"), copy_GBps=e.get("copy_GBps"), ember_status=m.get("status", "missing"),
                   torch_status=t.get("status", "missing"), flops=e.get("flops"))
        row.update({k: v for k, v in extra.items() if k not in row})
        for c in ("ember_warm", "ember_warm2"):  # warm steady time over the compiling process's
            if row.get(f"{c}_ms") and row["ember_ms"]:
                row[f"{c}_vs_cold"] = round(row[f"{c}_ms"] / row["ember_ms"], 3)
        for c in ("ember_max_autotune", "torch_max_autotune"):
            if row["eager_ms"] and row.get(f"{c}_ms"):
                row[f"{c}_speedup"] = round(row["eager_ms"] / row[f"{c}_ms"], 3)
        achieved(row, peaks, ("eager", "ember", "torch", "ember_max_autotune", "torch_max_autotune"))
        for c in ("ember", "torch"):
            if row["copy_GBps"] and row[f"{c}_GBps"]:
                row[f"{c}_pct_copy"] = round(100 * row[f"{c}_GBps"] / row["copy_GBps"], 1)
            if row["eager_ms"] and row[f"{c}_ms"]:
                row[f"{c}_speedup"] = round(row["eager_ms"] / row[f"{c}_ms"], 3)
        tol = TOL.get(wl, TOL_DEFAULT)
        row["ember_check"] = ("FAIL: " + (m.get("error") or "no result")) if m.get("status") != "ok" else (
            "ok" if (m.get("rel_err") or 0) <= tol else f"FAIL: rel err {m['rel_err']:.3g} > {tol}")
        if m.get("status") == "skipped":
            row["ember_check"] = "skipped: " + m.get("error", "")
        for c, r in (("ember", m), ("ember_warm", w)):  # which graphs each ember process replayed, and why
            decisions = (r.get("ember") or {}).get("cudagraph_decisions")
            if decisions is not None:
                row[f"{c}_cudagraph_decisions"] = decisions
        graphs = (m.get("ember") or {}).get("cudagraphs")
        if graphs is not None and m.get("mode") in ("reduce-overhead", "max-autotune"):
            row["ember_cudagraphs"] = graphs
            if row["ember_check"] == "ok":  # timed with graphs, or why not
                row["ember_check"] = (f"ok, {graphs['replays']} graph replays" if graphs["replays"] else
                                      f"ok, but no graph replayed ({graphs['skipped']} skipped, "
                                      f"{graphs['disabled']} disabled)")
        rows.append(row)

    def geo(vals):
        vals = [v for v in vals if v]
        return round(math.exp(sum(math.log(v) for v in vals) / len(vals)), 3) if vals else None
    core = [r for r in rows if r["workload"] not in EXTRA_ROWS]  # (the geomean is the original rows')
    both = [r for r in core if r.get("ember_speedup") and r.get("torch_speedup")]
    geomean = dict(ember=geo(r.get("ember_speedup") for r in core), torch=geo(r.get("torch_speedup") for r in core),
                   ember_common=geo(r["ember_speedup"] for r in both), torch_common=geo(r["torch_speedup"] for r in both),
                   common_workloads=len(both),
                   ember_max_autotune=geo(r.get("ember_max_autotune_speedup") for r in core),
                   torch_max_autotune=geo(r.get("torch_max_autotune_speedup") for r in core))
    return rows, geomean


def _f(v, fmt="{:.4g}"):
    return "—" if v is None else fmt.format(v)


def markdown(rows, geomean, mode) -> str:
    lines = ["| workload | eager ms | ember ms (speedup) | torch.compile ms (speedup) | ember compile s cold / warm "
             "| torch.compile compile s | ember max err | GB/s eager / ember / torch | check |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def ms(c):
            if r[f"{c}_ms"] is None:
                return r[f"{c}_status"]
            return f"{r[f'{c}_ms']:.4g} ({r.get(f'{c}_speedup', 0):.2f}x)" if r.get(f"{c}_speedup") else f"{r[f'{c}_ms']:.4g}"
        gbps = "—" if r["eager_GBps"] is None else " / ".join(_f(r[k], "{:.0f}") for k in ("eager_GBps", "ember_GBps", "torch_GBps"))
        if r.get("copy_GBps"):
            gbps += f" (copy {r['copy_GBps']:.0f}: ember {_f(r.get('ember_pct_copy'), '{:.0f}')}%)"
        lines.append(f"| {r['workload']} | {_f(r['eager_ms'])} | {ms('ember')} | {ms('torch')} | "
                     f"{_f(r['ember_cold_s'], '{:.1f}')} / {_f(r['ember_warm_s'], '{:.1f}')} | {_f(r['torch_cold_s'], '{:.1f}')} | "
                     f"{_f(r['ember_err'], '{:.3g}')} | {gbps} | {r['ember_check']} |")
    lines += ["", "| workload | GFLOP/step | TFLOP/s eager / ember / torch (% of mm peak) | % of copy peak eager / ember / torch "
              "| peak GB eager / ember / torch | ember warm ms (x cold) / warm2 | max-autotune ms ember / torch (speedup) |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        def trio(key, fmt="{:.3g}"):
            return " / ".join(_f(r.get(f"{c}_{key}"), fmt) for c in ("eager", "ember", "torch"))
        tf = trio("TFLOPs", "{:.1f}")
        if r.get("ember_pct_mm_peak") is not None:
            tf += f" ({_f(r.get('eager_pct_mm_peak'), '{:.0f}')} / {_f(r.get('ember_pct_mm_peak'), '{:.0f}')} / " \
                  f"{_f(r.get('torch_pct_mm_peak'), '{:.0f}')}%)"
        warm = (f"{_f(r.get('ember_warm_ms'))} ({_f(r.get('ember_warm_vs_cold'), '{:.2f}')}x) / "
                f"{_f(r.get('ember_warm2_ms'))} ({_f(r.get('ember_warm2_vs_cold'), '{:.2f}')}x)")
        ma = (f"{_f(r.get('ember_max_autotune_ms'))} ({_f(r.get('ember_max_autotune_speedup'), '{:.2f}')}x) / "
              f"{_f(r.get('torch_max_autotune_ms'))} ({_f(r.get('torch_max_autotune_speedup'), '{:.2f}')}x)")
        gflop = _f(r["flops"] / 1e9, "{:.1f}") if r.get("flops") else "—"
        lines.append(f"| {r['workload']} | {gflop} | {tf} | {trio('pct_copy_peak', '{:.0f}')} | "
                     f"{trio('peak_GB', '{:.2f}')} | {warm} | {ma} |")
    lines.append("")
    lines.append(f"Geomean speedup over eager (mode {mode}): ember {_f(geomean['ember'], '{:.3f}')}x, "
                 f"torch.compile {_f(geomean['torch'], '{:.3f}')}x; on the {geomean['common_workloads']} workloads "
                 f"both ran: ember {_f(geomean['ember_common'], '{:.3f}')}x, torch.compile "
                 f"{_f(geomean['torch_common'], '{:.3f}')}x." + (
                     f" max-autotune: ember {_f(geomean.get('ember_max_autotune'), '{:.3f}')}x, torch.compile "
                     f"{_f(geomean.get('torch_max_autotune'), '{:.3f}')}x." if geomean.get("ember_max_autotune")
                     or geomean.get("torch_max_autotune") else "") + f" (Geomeans leave out {', '.join(EXTRA_ROWS)}.)")
    return "\n".join(lines)


def write_report(out, results, workloads, args, jobs, label, wall) -> dict:
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    peaks = getattr(args, "peaks", None)
    rows, geomean = summarize(results, workloads, peaks)
    table = markdown(rows, geomean, args.mode)
    report = dict(benchmark="gpu_suite", date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  device=label, device_name=torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                  mode=args.mode, quick=args.quick, jobs=jobs, timeout_s=args.timeout, budget_s=args.budget,
                  python=platform.python_version(), torch=torch.__version__, triton=triton_version,
                  platform=platform.platform(), wall_s=round(wall, 1),
                  method="own process per (workload, compiler), fresh caches (ember-warm reuses ember's); "
                         "compile s = wrapping + first call; CUDA events around N calls, median of 5 loops; "
                         "error vs eager in the same process; copy_GBps = y.copy_(x) of the same input",
                  device_peaks=peaks, geomean=geomean, rows=rows, results=results, markdown=table)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(tmp, out)
    return report


def device_label(device: str) -> str:
    import torch
    if device.startswith("cuda"):
        return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(torch.device(device)).lower()).strip("-")
    return "cpu"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", default="default", choices=MODES)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--compilers", default=",".join(DEFAULT_COMPILERS), help="subset of " + ",".join(COMPILERS))
    p.add_argument("--max-autotune", action="store_true",
                   help="also run ember and torch.compile in mode max-autotune (fresh caches), in the same run")
    p.add_argument("--no-peaks", action="store_true", help="skip measuring the device's copy and matmul peaks")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--quick", action="store_true", help="tiny shapes and few iterations (a smoke test)")
    p.add_argument("--timeout", type=float, default=240, help="seconds per process")
    p.add_argument("--budget", type=float, default=540,
                   help="seconds for the whole run: processes that would start later are skipped, and the last "
                        "ones get only the time left (results are written after every process)")
    p.add_argument("--jobs", type=int, default=None, help="processes at a time (default 4 on cuda, 1 on cpu)")
    p.add_argument("--out", default=None)
    p.add_argument("--merge", action="store_true",
                   help="keep the results of workloads not run now from the existing output file")
    p.add_argument("--child", nargs=2, metavar=("WORKLOAD", "COMPILER"), help=argparse.SUPPRESS)
    p.add_argument("--child-peaks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-timing", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lock", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    import torch
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.child:
        rec = measure(*args.child, args.mode, args.device, args.quick, not args.no_timing, args.lock)
        print("RESULT " + json.dumps(rec), flush=True)
        return 0
    if args.child_peaks:
        print("RESULT " + json.dumps(dict(device_peaks(args.device, args.quick), status="ok")), flush=True)
        return 0

    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads {sorted(unknown)}; choose from {','.join(WORKLOADS)}")
    wanted = args.compilers.split(",") + (list(MAX_AUTOTUNE) if args.max_autotune else [])
    unknown = set(wanted) - set(COMPILERS) - {""}
    if unknown:
        p.error(f"unknown compilers {sorted(unknown)}; choose from {','.join(COMPILERS)}")
    compilers = [c for c in COMPILERS if c in wanted]
    jobs = args.jobs or (4 if args.device.startswith("cuda") else 1)
    lock_dir = tempfile.mkdtemp(prefix="gpu_suite_lock_")
    args.lock = os.path.join(lock_dir, "gpu.lock") if jobs > 1 else None
    t0 = time.perf_counter()
    args.deadline = t0 + args.budget
    label = device_label(args.device)
    suffix = "" if args.mode == "default" else f"-{args.mode}"
    out = args.out or os.path.join(HERE, "results", f"gpu_suite-{label}{suffix}.json")
    results, done = [], threading.Lock()
    report_workloads = workloads
    if args.merge and os.path.exists(out):
        with open(out) as f:
            old = json.load(f)
        kept = [r for r in old.get("results", []) if r["workload"] not in workloads and r.get("mode") == args.mode]
        results.extend(kept)
        report_workloads = [w for w in WORKLOADS if w in workloads or any(r["workload"] == w for r in kept)]

    def log(rec):
        what = (f"{rec.get('ms', '-')} ms, first call {rec.get('first_call_s', '-')} s, err {rec.get('max_abs_err', '-')}"
                if rec["status"] == "ok" else f"{rec['status']}: {rec.get('error', '')}")
        print(f"[{time.perf_counter() - t0:6.1f}s] {rec['workload']:<15} {rec['compiler']:<11} {what}", flush=True)
        with done:  # results so far reach the disk at once: an interrupted run still leaves them
            results.append(rec)
            report = write_report(out, results, report_workloads, args, jobs, label, time.perf_counter() - t0)
        return report

    args.child_env = child_env(lock_dir)
    args.peaks = None
    if not args.no_peaks:  # the device's own copy bandwidth and bf16 matmul rate, measured in this run
        cmd = [sys.executable, os.path.abspath(__file__), "--child-peaks", "--device", args.device] + (
            ["--quick"] if args.quick else [])
        got = run_measured(cmd, args.child_env, ROOT, 120, dict(status="failed"))
        args.peaks = got if got.get("status") == "ok" else None
        print(f"device peaks: {json.dumps(args.peaks or got)}", flush=True)
    order = sorted(workloads, key=lambda w: ORDER.index(w))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(lambda w: run_workload(w, args, compilers, log), order))
    shutil.rmtree(lock_dir, ignore_errors=True)
    report = write_report(out, results, report_workloads, args, jobs, label, time.perf_counter() - t0)
    rows = report["rows"]
    print("\n" + report["markdown"])
    print(f"\nwrote {os.path.relpath(out, ROOT)} in {report['wall_s']:.0f} s")
    failed = [r["workload"] for r in rows if r["ember_check"].startswith("FAIL")]
    if failed:
        print(f"ember FAILED on: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
