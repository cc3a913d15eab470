"""The CPU suite (issue 25): eager, ember and torch.compile (default backend: Inductor's C++) side by side
in one run, at a fixed thread count, on the rows of the issue's Acceptance section.

    python benchmarks/cpu_suite.py --threads 1                       # every row, all compilers
    python benchmarks/cpu_suite.py --threads all --workloads mlp,softmax_8k
    python benchmarks/cpu_suite.py --ember-env EMBER_NATIVE_CPU=cpp  # the ember variant's settings
    python benchmarks/cpu_suite.py --quick --compilers eager,ember,ember-warm   # tiny shapes: a smoke test

Rows: mlp (3 Linear+GELU, b32), ln_gelu_1k / ln_gelu_8k (layer_norm+GELU 1024x1024 / 8192x1024 fp32),
softmax_1k / softmax_8k (softmax(x*0.125) 1024x1024 / 8192x1024), gpt2 (transformers GPT2Model, 2
layers from a small config, random init, b4x128), cnn (a small conv net, b1 3x128x128), encoder
(nn.TransformerEncoderLayer d256, b16x128), mlp_train and gpt2_train (a training step: forward,
backward, optimizer step; the optimizer runs eagerly for every compiler). Inference rows run under
no_grad, all fp32.

Method. Every (workload, compiler) runs in its own process (this script, ``--child``), with
``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` and ``torch.set_num_threads`` fixed to ``--threads`` (1, or
``all``: the cores this process may use). Cold compile: ember gets a fresh ``EMBER_CACHE_DIR``,
torch.compile a fresh ``TORCHINDUCTOR_CACHE_DIR`` (temp dirs); a second process (``ember-warm``,
``torch-warm``) then reuses them, so its first call is the warm compile. Compile time = wrapping +
first call, with the compiler's top-level import timed apart (``import_s``). Python's bytecode cache
is warmed once first, as on an installed system. Steady time: rounds of N calls (N picked so a round
takes about ``--round-s``), median of ``--rounds`` rounds, with min, max and spread. Each compiled process
also times an eager twin in rounds alternating with its own (``paired_speedup``: the median ratio of
neighbouring rounds), which a shared machine's changing load skews far less than two processes. Correctness: every
process runs eager on the same inputs first and records the relative error (max |out - eager| / max
|eager|; training rows: the first step's loss and every parameter's gradient, against an identical
eager twin) with a tolerance for fp32. Memory-bound rows also record GB/s against a plain copy of the
same size (``y.copy_(x)``; ``x.clone()``, allocation included, beside it), measured in the eager
process; each compiled process also times that copy in rounds alternating with its own
(``paired_pct_copy``), the fairer percentage on a shared machine. Processes run one at a time; ``--budget`` bounds the whole run (those that would start too
late are skipped) and the JSON is rewritten after each process, so a run cut short still leaves its
results.

Writes ``benchmarks/results/cpu_suite-<machine>-t<threads>[-<tag>].json`` and prints a markdown table
with geomean speedups and the issue's targets. Exits 1 if an ember run failed or differs from eager.
"""
from __future__ import annotations

import argparse
import contextlib
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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _proc import run_measured  # noqa: E402

WORKLOADS = ("mlp", "ln_gelu_1k", "ln_gelu_8k", "softmax_1k", "softmax_8k", "gpt2", "cnn", "encoder", "mlp_train",
             "gpt2_train")
COMPILERS = ("eager", "ember", "ember-warm", "torch", "torch-warm")
# relative error vs eager above which a row fails: fp32 pointwise/reductions agree to rounding, rows with
# matmuls or convolutions may reassociate sums (a C++ kernel or a fused epilogue), training adds backward
TOL = {"ln_gelu_1k": 1e-4, "ln_gelu_8k": 1e-4, "softmax_1k": 1e-4, "softmax_8k": 1e-4}
TOL_DEFAULT = 1e-3
# the targets (Acceptance)
TARGET_PCT_COPY, TARGET_COLD_FRACTION, TARGET_WARM_S, TARGET_GEOMEAN_RATIO = 70.0, 1 / 3, 1.0, 1.2


# ------------------------------------------------------------------------------------------ workloads

def _ln_gelu(rows, n):
    import torch
    x, w, b = torch.randn(rows, n), torch.randn(n), torch.randn(n)

    def f(x, w, b):
        return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (n,), w, b))
    return f, (x, w, b), 2 * x.numel() * 4  # x read once, the result written once


def _softmax(rows, n):
    import torch
    x = torch.randn(rows, n)

    def f(x):
        return torch.softmax(x * 0.125, dim=-1)
    return f, (x,), 2 * x.numel() * 4


def _mlp(quick):
    import torch
    d0, d1, b = (64, 128, 4) if quick else (512, 1024, 32)
    m = torch.nn.Sequential(torch.nn.Linear(d0, d1), torch.nn.GELU(), torch.nn.Linear(d1, d1), torch.nn.GELU(),
                            torch.nn.Linear(d1, 10))
    return m, torch.randn(b, d0)


def _gpt2(quick):
    import torch
    from transformers import GPT2Config, GPT2Model
    # no dropout: the training row compares a step against an eager twin, which needs equal masks
    cfg = GPT2Config(n_layer=2, n_embd=64 if quick else 256, n_head=4 if quick else 8, vocab_size=128 if quick else 1024,
                     n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    cfg._attn_implementation = "sdpa"
    m = GPT2Model(cfg)
    return m, torch.randint(0, cfg.vocab_size, (2, 16) if quick else (4, 128))


def _cnn(quick):
    import torch
    from torch import nn

    def block(i, o):
        return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2)]
    m = nn.Sequential(*block(3, 32), *block(32, 64), *block(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(128, 10))
    return m, torch.randn(1, 3, *((32, 32) if quick else (128, 128)))


def _encoder(quick):
    import torch
    d, ff, b, s = (32, 64, 2, 8) if quick else (256, 1024, 16, 128)
    m = torch.nn.TransformerEncoderLayer(d, 8 if not quick else 4, ff, dropout=0.0, batch_first=True)
    return m, torch.randn(b, s, d)


def _inference(model, x, pick=lambda out: out):
    import torch
    model.eval()

    def build(c):
        cm = c(model)

        def step(x):
            with torch.no_grad():
                return pick(cm(x))
        return step
    return build, (x,), None


def _training(model, x, opt_cls, loss_of):
    """One training step: zero grads, forward + loss (compiled), backward, optimizer step (eager). Returns
    the loss and the model, whose .grad the correctness check reads after the first step."""
    import torch
    model.train()
    opt = opt_cls(model.parameters(), lr=1e-3)

    def build(c):
        cm = c(model)

        def step(x):
            opt.zero_grad(set_to_none=True)
            loss = loss_of(cm, x)
            loss.backward()
            opt.step()
            return loss.detach()
        step.model = model
        return step
    return build, (x,), None


def make(wl: str, quick: bool):
    """(build(compiler) -> step, inputs, bytes moved or None); ``quick``: tiny shapes (a smoke run)."""
    import torch
    if wl.startswith(("ln_gelu", "softmax")):
        small = (64, 128) if quick else (1024, 1024)
        f, inputs, nbytes = (_ln_gelu if wl.startswith("ln_gelu") else _softmax)(*(
            small if wl.endswith("_1k") or quick else (8192, 1024)))
        return (lambda c: c(f)), inputs, nbytes
    if wl == "mlp":
        return _inference(*_mlp(quick))
    if wl == "gpt2":
        return _inference(*_gpt2(quick), pick=lambda out: out.last_hidden_state)
    if wl == "cnn":
        return _inference(*_cnn(quick))
    if wl == "encoder":
        return _inference(*_encoder(quick))
    if wl == "mlp_train":
        m, x = _mlp(quick)
        y = torch.randint(0, 10, (x.shape[0],))
        build, inputs, _ = _training(m, x, lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9),
                                     lambda cm, x: torch.nn.functional.cross_entropy(cm(x), y))
        return build, inputs, None
    if wl == "gpt2_train":
        m, ids = _gpt2(quick)
        build, inputs, _ = _training(m, ids, torch.optim.AdamW,
                                     lambda cm, ids: cm(ids).last_hidden_state.float().pow(2).mean())
        return build, inputs, None
    raise SystemExit(f"unknown workload {wl}")


# --------------------------------------------------------------------------------- one measured process

def compiler_fn(compiler: str):
    """(wrap, import seconds): the compiler's top-level import is timed apart from its compile."""
    import torch
    t0 = time.perf_counter()
    if compiler == "eager":
        return (lambda f: f), 0.0
    if compiler.startswith("ember"):
        import ember
        # torch's shape machinery, which ember's first call would import anyway (it pulls torch._dynamo's
        # package in through torch.fx.experimental.validator): an import, as torch.compile's is below
        import torch.fx.experimental.symbolic_shapes  # noqa: F401
        import torch.fx.experimental.validator  # noqa: F401 - (ShapeEnv imports it, and torch._dynamo, lazily)
        return ember.compile, round(time.perf_counter() - t0, 3)
    if compiler.startswith("torch"):
        import torch._dynamo  # noqa: F401 - what torch.compile imports first; the peer, never ember's code
        return torch.compile, round(time.perf_counter() - t0, 3)
    raise SystemExit(f"unknown compiler {compiler}")


def _outputs(step, out):
    """The tensors a row is checked on: its output, plus every gradient for a training step."""
    model = getattr(step, "model", None)
    grads = [] if model is None else [p.grad for p in model.parameters() if p.grad is not None]
    return [out.detach().float().clone()] + [g.detach().float().clone() for g in grads]


def rel_error(got: list, ref: list) -> float:
    if len(got) != len(ref):  # a missing gradient is a wrong result, not a small one
        return math.inf
    err = 0.0
    for g, r in zip(got, ref):
        if g.shape != r.shape:
            return math.inf
        scale = r.abs().max().item() or 1.0
        err = max(err, (g - r).abs().max().item() / scale)
    return err


def measure(wl: str, compiler: str, quick: bool, threads: int, timing: bool, rounds: int, round_s: float) -> dict:
    import torch
    torch.set_num_threads(threads)
    # the reference: eager on an identical twin (same seed), first call, in this process
    torch.manual_seed(0)
    twin_build, twin_inputs, _ = make(wl, quick)
    torch.manual_seed(1)
    twin = twin_build(lambda f: f)
    ref = _outputs(twin, twin(*twin_inputs))
    del twin, twin_build, twin_inputs
    torch.manual_seed(0)
    build, inputs, nbytes = make(wl, quick)
    wrap, import_s = compiler_fn(compiler)
    modules = len(sys.modules)
    t0 = time.perf_counter()  # compile as a user sees it: wrapping + the first call
    step = build(wrap)
    torch.manual_seed(1)
    out = step(*inputs)
    first = time.perf_counter() - t0
    lazy = len(sys.modules) - modules  # modules the compile itself imported (counted in its time)
    err = rel_error(_outputs(step, out), ref)
    tol = TOL.get(wl, TOL_DEFAULT)
    rec = dict(workload=wl, compiler=compiler, status="ok", threads=torch.get_num_threads(), import_s=import_s,
               first_call_s=round(first, 3), first_call_imports=lazy, rel_err=err, tol=tol, match=err <= tol)
    del out, ref
    if timing:
        faults = []
        times, iters = time_rounds(lambda: step(*inputs), rounds, round_s, faults)
        # page faults per call, median of the rounds (a one-off settling of the first rounds left out): first
        # touches of memory the allocator took from the OS, e.g. glibc returning freed blocks at each step,
        # which no kernel profile shows (ember/native/cpu_heap.py)
        rec.update(round_stats(times), iters=iters, faults_per_call=round(statistics.median(faults) / iters, 1))
        if compiler != "eager":  # eager again, rounds interleaved with this compiler's (see paired_rounds)
            torch.manual_seed(0)
            twin_build, twin_inputs, _ = make(wl, quick)
            twin = twin_build(lambda f: f)
            e_times, c_times = paired_rounds(lambda: twin(*twin_inputs), lambda: step(*inputs), rounds, round_s)
            rec.update(paired_eager_ms=round(statistics.median(e_times), 4), paired_ms=round(statistics.median(c_times), 4),
                       paired_speedup=round(statistics.median(e / c for e, c in zip(e_times, c_times)), 3))
            del twin, twin_inputs
        if nbytes:
            rec["bytes"] = nbytes
            rec["GBps"] = round(nbytes / (rec["ms"] * 1e-3) / 1e9, 2)
            if compiler == "eager":  # the ceilings the memory-bound rows are held to (see copy_bandwidth)
                rec["copy_GBps"], rec["clone_GBps"] = copy_bandwidth(inputs[0], rounds, round_s)
            else:  # the same ceiling timed in rounds alternating with this compiler's (a shared machine)
                x = inputs[0]
                y = torch.empty_like(x)
                c_times, s_times = paired_rounds(lambda: y.copy_(x), lambda: step(*inputs), rounds, round_s)
                rec["paired_pct_copy"] = round(100 * statistics.median(c / t for c, t in zip(c_times, s_times)), 1)
    return rec


def _minor_faults() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_rounds(fn, rounds: int, round_s: float, faults: list | None = None) -> tuple[list, int]:
    """ms per call in each of ``rounds`` rounds of N calls, N chosen so a round takes ~``round_s``
    (after warm-up calls that also settle any recompile); ``faults``: gets each round's page faults."""
    t = time.perf_counter()
    fn()
    fn()
    per = (time.perf_counter() - t) / 2
    for _ in range(max(1, min(5, int(0.2 / max(per, 1e-6))))):  # more warm-up, at most ~0.2 s of it
        fn()
    iters = max(1, int(round_s / max(per, 1e-6)))
    times = []
    for _ in range(rounds):
        f0 = _minor_faults()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t) * 1e3 / iters)
        if faults is not None:
            faults.append(_minor_faults() - f0)
    return times, iters


def paired_rounds(eager, compiled, rounds: int, round_s: float) -> tuple[list, list]:
    """Rounds of eager and of the compiled step, alternating in one process: on a shared machine whose
    load changes from minute to minute, the ratio of neighbouring rounds is a fairer speedup than
    that of two processes timed minutes apart (the recorded ms stay the separate processes')."""
    _, n_e = time_rounds(eager, 1, round_s / 2)
    _, n_c = time_rounds(compiled, 1, round_s / 2)
    e_times, c_times = [], []
    for _ in range(rounds):
        for fn, n, out in ((eager, n_e, e_times), (compiled, n_c, c_times)):
            t = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - t) * 1e3 / n)
    return e_times, c_times


def round_stats(times: list) -> dict:
    ms = statistics.median(times)
    return dict(ms=round(ms, 4), ms_min=round(min(times), 4), ms_max=round(max(times), 4),
                spread_pct=round(100 * (max(times) - min(times)) / ms, 1), ms_rounds=[round(t, 4) for t in times])


def copy_bandwidth(x, rounds: int, round_s: float) -> tuple[float, float]:
    """GB/s of a plain copy of the row's input (x read once, the copy written once): ``y.copy_(x)`` into
    a buffer kept across calls (the target's ceiling), and ``x.clone()``, which allocates its result
    each call as an out-of-place op does (large blocks come fresh from the OS, page faults included)."""
    import torch
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * x.element_size()
    out = []
    for fn in (lambda: y.copy_(x), x.clone):
        times, _ = time_rounds(fn, rounds, round_s)
        out.append(round(nbytes / (statistics.median(times) * 1e-3) / 1e9, 2))
    return tuple(out)


def ember_settings(ember_env: dict) -> dict:
    """What ember made of each ``--ember-env`` EMBER_* setting: a variable this ember does not know is
    ignored by it, so the JSON says so instead of silently measuring the default."""
    out = {}
    try:
        import ember
    except ImportError as e:
        return {"error": str(e)}
    for var in ember_env:
        if var.startswith("EMBER_"):
            try:
                out[var] = repr(getattr(ember.config, var[len("EMBER_"):].lower()))
            except AttributeError:
                out[var] = "not a setting of this ember (ignored)"
    return out


# ------------------------------------------------------------------------------------------ the driver

def run_child(wl, compiler, args, env, timing=True) -> dict:
    base = dict(workload=wl, compiler=compiler)
    left = args.deadline - time.perf_counter()
    if left < 10:  # the whole run must end in time (a killed run would leave no results)
        return dict(base, status="skipped", error=f"out of the --budget of {args.budget:.0f} s")
    timeout = min(args.timeout, left)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", wl, compiler, "--threads", str(args.threads),
           "--rounds", str(args.rounds), "--round-s", str(args.round_s)]
    cmd += ["--quick"] * args.quick + ["--no-timing"] * (not timing)
    return run_measured(cmd, env, ROOT, timeout, base)


def child_env(args, tmp: str) -> dict:
    """Every measured process's environment: this one's, the thread count fixed, the repository on the
    path, Python's bytecode cached under ``tmp`` and warmed up once here (an installed package has its
    bytecode already; without this each cold process would count compiling ember's or Inductor's
    modules from source as compile time). Compiler caches are per process kind: see run_workload."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"), OMP_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for var in [v for v in env if v.startswith("EMBER_")]:  # ember's settings are --ember-env's alone
        env.pop(var)
    mods = ["torch", "ember", "ember.native.backend", "ember.aot", "transformers"]
    if any(c.startswith("torch") for c in args.compilers):
        mods += ["torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.codegen.cpp"]
    code = "import importlib\nfor m in %r:\n    try:\n        importlib.import_module(m)\n    except ImportError:\n        pass" % (
        mods,)
    subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, timeout=600)
    return env


def run_workload(wl, args, log) -> None:
    tmp = tempfile.mkdtemp(prefix=f"cpu_suite_{wl}_")
    done = {}
    try:
        for c in args.compilers:
            env = dict(args.child_env)
            if c.startswith("torch"):  # cold and warm share these: the warm run finds what the cold one wrote
                env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
            elif c.startswith("ember"):
                env.update(args.ember_env, EMBER_CACHE_DIR=os.path.join(tmp, "ember"))
            cold = c.removesuffix("-warm")
            if c.endswith("-warm") and done.get(cold) != "ok":
                rec = dict(workload=wl, compiler=c, status="skipped", error=f"no cold {cold} run")
            else:
                rec = run_child(wl, c, args, env, timing=not c.endswith("-warm"))
            done[c] = rec["status"]
            log(rec)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _geo(vals):
    vals = [v for v in vals if v]
    return round(math.exp(sum(math.log(v) for v in vals) / len(vals)), 3) if vals else None


def summarize(results: list, workloads) -> tuple[list, dict]:
    by = {(r["workload"], r["compiler"]): r for r in results}
    rows = []
    for wl in workloads:
        e, m, mw, t, tw = (by.get((wl, c), {}) for c in COMPILERS)
        row = dict(workload=wl, eager_ms=e.get("ms"), eager_spread_pct=e.get("spread_pct"), copy_GBps=e.get("copy_GBps"),
                   clone_GBps=e.get("clone_GBps"), eager_GBps=e.get("GBps"))
        for c, r, w in (("ember", m, mw), ("torch", t, tw)):
            row.update({f"{c}_ms": r.get("ms"), f"{c}_spread_pct": r.get("spread_pct"), f"{c}_status": r.get("status", "not run"),
                        f"{c}_cold_s": r.get("first_call_s"), f"{c}_warm_s": w.get("first_call_s"),
                        f"{c}_import_s": r.get("import_s"), f"{c}_rel_err": r.get("rel_err"), f"{c}_GBps": r.get("GBps")})
            if row["eager_ms"] and r.get("ms"):
                row[f"{c}_speedup"] = round(row["eager_ms"] / r["ms"], 3)
            row[f"{c}_paired_speedup"] = r.get("paired_speedup")
            if row["copy_GBps"] and r.get("GBps"):
                row[f"{c}_pct_copy"] = round(100 * r["GBps"] / row["copy_GBps"], 1)
            if r.get("paired_pct_copy") is not None:
                row[f"{c}_paired_pct_copy"] = r["paired_pct_copy"]
            row[f"{c}_check"] = _check(r, w)
        row["targets"] = _targets(row)
        rows.append(row)
    both = [r for r in rows if r.get("ember_speedup") and r.get("torch_speedup")]
    geomean = dict(ember=_geo(r.get("ember_speedup") for r in rows), torch=_geo(r.get("torch_speedup") for r in rows),
                   ember_paired=_geo(r.get("ember_paired_speedup") for r in rows),
                   torch_paired=_geo(r.get("torch_paired_speedup") for r in rows),
                   ember_common=_geo(r["ember_speedup"] for r in both), torch_common=_geo(r["torch_speedup"] for r in both),
                   common_workloads=len(both))
    if geomean["ember_common"] and geomean["torch_common"]:
        geomean["target_ember_ge_1.2x_torch"] = geomean["ember_common"] >= TARGET_GEOMEAN_RATIO * geomean["torch_common"]
    return rows, geomean


def _check(r: dict, warm: dict) -> str:
    """ok, or why not: a failed process or a result off eager's beyond the row's tolerance (the warm
    process is checked too: a wrong program loaded from the disk cache is a wrong result)."""
    for rec in (r, warm):
        if not rec or rec.get("status") == "skipped":
            continue
        if rec.get("status") != "ok":
            return f"FAIL ({rec['compiler']}): {rec.get('error', 'no result')}"
        if not rec.get("match"):
            return f"FAIL ({rec['compiler']}): rel err {rec['rel_err']:.3g} > {rec['tol']}"
    if not r:
        return "not run"
    return "ok" if r.get("status") == "ok" else "skipped: " + r.get("error", "")


def _targets(row: dict) -> dict:
    """The issue's per-row targets for ember, each True/False, or absent when this run lacks the numbers."""
    t = {}
    if row.get("ember_speedup"):
        t["speedup_ge_1"] = row["ember_speedup"] >= 1.0
    if row.get("ember_pct_copy") is not None:
        t["pct_copy_ge_70"] = row["ember_pct_copy"] >= TARGET_PCT_COPY
    if row.get("ember_cold_s") is not None and row.get("torch_cold_s"):
        t["cold_le_third_of_torch"] = row["ember_cold_s"] <= TARGET_COLD_FRACTION * row["torch_cold_s"]
    if row.get("ember_warm_s") is not None:
        t["warm_le_1s"] = row["ember_warm_s"] <= TARGET_WARM_S
    return t


def _f(v, fmt="{:.4g}"):
    return "—" if v is None else fmt.format(v)


def markdown(rows, geomean, threads) -> str:
    lines = ["| workload | eager ms (±%) | ember ms (±%, speedup) | torch.compile ms (±%, speedup) | ember compile s "
             "cold / warm | torch.compile compile s cold / warm | GB/s eager / ember / torch (copy_, clone; ember % of copy_, paired) | "
             "ember rel err | check |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def ms(c):
            if r[f"{c}_ms"] is None:
                return r[f"{c}_status"]
            sp = f", {r[f'{c}_speedup']:.2f}x" if r.get(f"{c}_speedup") else ""
            if r.get(f"{c}_paired_speedup"):
                sp += f", paired {r[f'{c}_paired_speedup']:.2f}x"
            return f"{r[f'{c}_ms']:.4g} (±{r[f'{c}_spread_pct']:.0f}%{sp})"
        eager = "—" if r["eager_ms"] is None else f"{r['eager_ms']:.4g} (±{r['eager_spread_pct']:.0f}%)"
        gbps = "—"
        if r["eager_GBps"] is not None:
            gbps = " / ".join(_f(r[k], "{:.1f}") for k in ("eager_GBps", "ember_GBps", "torch_GBps"))
            gbps += (f" ({_f(r['copy_GBps'], '{:.1f}')}, clone {_f(r['clone_GBps'], '{:.1f}')}; "
                     f"{_f(r.get('ember_pct_copy'), '{:.0f}')}%, paired {_f(r.get('ember_paired_pct_copy'), '{:.0f}')}%)")
        check = r["ember_check"] + ("" if r["torch_check"] in ("ok", "not run") else f"; torch: {r['torch_check']}")
        lines.append(f"| {r['workload']} | {eager} | {ms('ember')} | {ms('torch')} | "
                     f"{_f(r['ember_cold_s'], '{:.2f}')} / {_f(r['ember_warm_s'], '{:.2f}')} | "
                     f"{_f(r['torch_cold_s'], '{:.1f}')} / {_f(r['torch_warm_s'], '{:.1f}')} | {gbps} | "
                     f"{_f(r['ember_rel_err'], '{:.2g}')} | {check} |")
    lines += ["", f"Geomean speedup over eager ({threads} thread(s)): ember {_f(geomean['ember'], '{:.3f}')}x, "
              f"torch.compile {_f(geomean['torch'], '{:.3f}')}x; on the {geomean['common_workloads']} rows both ran: "
              f"ember {_f(geomean['ember_common'], '{:.3f}')}x, torch.compile {_f(geomean['torch_common'], '{:.3f}')}x; "
              f"paired (eager rounds interleaved in each process): ember {_f(geomean.get('ember_paired'), '{:.3f}')}x, "
              f"torch.compile {_f(geomean.get('torch_paired'), '{:.3f}')}x."]
    met = []  # the targets: rows meeting each, of the rows this run has the numbers for
    for key, what in TARGET_WORDS.items():
        vals = [r["targets"][key] for r in rows if key in r["targets"]]
        if vals:
            met.append(f"{what} {sum(vals)}/{len(vals)}")
    if "target_ember_ge_1.2x_torch" in geomean:
        met.append(f"geomean >= 1.2x torch.compile's {'yes' if geomean['target_ember_ge_1.2x_torch'] else 'no'}")
    lines.append("Targets met by ember (rows): " + ("; ".join(met) or "none measured") + ".")
    return "\n".join(lines)


TARGET_WORDS = {"speedup_ge_1": ">= 1.0x eager", "pct_copy_ge_70": ">= 70% of copy_ GB/s",
                "cold_le_third_of_torch": "cold compile <= 1/3 of torch.compile's", "warm_le_1s": "warm compile <= 1 s"}


def machine_info(args) -> dict:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    return dict(name=args.machine, cpu=model, cores_usable=len(os.sched_getaffinity(0)), cpu_count=os.cpu_count(),
                notes=args.notes)


def write_report(out, results, workloads, args, wall) -> dict:
    import torch
    rows, geomean = summarize(results, workloads)
    report = dict(benchmark="cpu_suite", date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  machine=machine_info(args), threads=args.threads, ember_env=args.ember_env, quick=args.quick,
                  rounds=args.rounds, round_s=args.round_s, timeout_s=args.timeout, budget_s=args.budget,
                  python=platform.python_version(), torch=torch.__version__, platform=platform.platform(),
                  wall_s=round(wall, 1),
                  method="own process per (workload, compiler) at a fixed thread count; cold = fresh EMBER_CACHE_DIR / "
                         "TORCHINDUCTOR_CACHE_DIR, warm = a second process on the same caches; compile s = wrapping + "
                         "first call (import_s apart); ms = median of rounds of N calls (spread = (max-min)/median); "
                         "rel err = max|out-eager|/max|eager| in the same process (training: loss and every grad of "
                         "the first step vs an eager twin); copy_GBps = y.copy_(x) of the row's input (the target's ceiling), "
                         "clone_GBps = x.clone() (allocation included)",
                  geomean=geomean, rows=rows, results=results, markdown=markdown(rows, geomean, args.threads))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(out + ".tmp", out)
    return report


def _env_pairs(items) -> dict:
    env = {}
    for item in items:
        var, eq, val = item.partition("=")
        if not eq or not var:
            raise SystemExit(f"--ember-env {item!r}: write NAME=VALUE, e.g. --ember-env EMBER_NATIVE_CPU=cpp")
        env[var] = val
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="subset of " + ",".join(WORKLOADS))
    p.add_argument("--compilers", default=",".join(COMPILERS),
                   help="subset of " + ",".join(COMPILERS) + " (each in its own process; ember-warm / torch-warm: a second "
                        "process on the disk cache the cold one filled, timing the warm start beyond imports)")
    p.add_argument("--threads", default="1", help="intra-op threads of every process: a number, or 'all'")
    p.add_argument("--ember-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the ember processes only (repeatable), e.g. EMBER_NATIVE_CPU=cpp; "
                        "no other EMBER_* variable reaches them")
    p.add_argument("--quick", action="store_true", help="tiny shapes (a smoke test of the harness)")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds per process (median and spread)")
    p.add_argument("--round-s", type=float, default=0.3, help="seconds per timed round (sets calls per round)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per process")
    p.add_argument("--budget", type=float, default=1800,
                   help="seconds for the whole run: processes that would start later are skipped (results are "
                        "written after every process)")
    p.add_argument("--machine", default=None, help="machine name for the file and JSON (default: the CPU model)")
    p.add_argument("--notes", default="", help="machine notes for the JSON (e.g. shared, noisy)")
    p.add_argument("--tag", default="", help="suffix of the result file's name (e.g. cpp for --ember-env runs)")
    p.add_argument("--out", default=None, help="the JSON to write (default: benchmarks/results/cpu_suite-<machine>-t<threads>[-<tag>].json)")
    p.add_argument("--merge", action="store_true", help="keep other workloads' results from the existing output file")
    p.add_argument("--child", nargs=2, metavar=("WORKLOAD", "COMPILER"), help=argparse.SUPPRESS)
    p.add_argument("--no-timing", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.threads = len(os.sched_getaffinity(0)) if args.threads == "all" else int(args.threads)
    if args.child:
        rec = measure(*args.child, args.quick, args.threads, not args.no_timing, args.rounds, args.round_s)
        if args.child[1].startswith("ember"):
            rec["ember_settings"] = ember_settings({k: v for k, v in os.environ.items() if k.startswith("EMBER_")})
        print("RESULT " + json.dumps(rec), flush=True)
        return 0

    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(WORKLOADS) | set(args.compilers.split(",")) - set(COMPILERS)
    if unknown:
        p.error(f"unknown {sorted(unknown)}; workloads: {','.join(WORKLOADS)}; compilers: {','.join(COMPILERS)}")
    args.compilers = [c for c in COMPILERS if c in args.compilers.split(",")]
    args.ember_env = _env_pairs(args.ember_env)
    args.machine = args.machine or re.sub(r"[^a-z0-9]+", "-", machine_info(args)["cpu"].lower()).strip("-")
    t0 = time.perf_counter()
    args.deadline = t0 + args.budget
    out = args.out or os.path.join(HERE, "results", f"cpu_suite-{args.machine}-t{args.threads}"
                                   f"{'-' + args.tag if args.tag else ''}.json")
    results, report_workloads = [], workloads
    if args.merge and os.path.exists(out):
        with open(out) as f:
            kept = [r for r in json.load(f).get("results", []) if r["workload"] not in workloads]
        results.extend(kept)
        report_workloads = [w for w in WORKLOADS if w in workloads or any(r["workload"] == w for r in kept)]

    def log(rec):
        what = (f"{rec.get('ms', '-')} ms, first call {rec.get('first_call_s', '-')} s, rel err {rec.get('rel_err'):.3g}"
                if rec["status"] == "ok" else f"{rec['status']}: {rec.get('error', '')}")
        print(f"[{time.perf_counter() - t0:6.1f}s] {rec['workload']:<11} {rec['compiler']:<10} {what}", flush=True)
        results.append(rec)  # on disk at once: an interrupted run still leaves them
        write_report(out, results, report_workloads, args, time.perf_counter() - t0)

    tmp = tempfile.mkdtemp(prefix="cpu_suite_")
    try:
        args.child_env = child_env(args, tmp)
        for wl in workloads:
            run_workload(wl, args, log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = write_report(out, results, report_workloads, args, time.perf_counter() - t0)
    print("\n" + report["markdown"])
    print(f"\nwrote {os.path.relpath(out, ROOT)} in {report['wall_s']:.0f} s")
    failed = [r["workload"] for r in report["rows"] if r["ember_check"].startswith("FAIL")]
    if failed:
        print(f"ember FAILED on: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
