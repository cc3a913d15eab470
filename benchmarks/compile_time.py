"""Compile time, ember vs torch.compile, each case in fresh processes (issue 29's acceptance table).

    python benchmarks/compile_time.py --device cuda                        # every row (~4-5 min on an H100)
    python benchmarks/compile_time.py --device cuda --workloads llama_infer,llama_train
    python benchmarks/compile_time.py --device cpu --quick                 # tiny shapes, CPU rows (C++ renderer)

Rows: the workloads of ``gpu_suite.py`` (its ``make``: same models and shapes), ``llama_infer`` and
``llama_train`` (a Llama-architecture model of ~1.2B parameters from transformers' ``LlamaConfig``:
24 layers, hidden 2048, MLP 5632, 32 heads (4 KV heads), vocab 32000, random weights, bf16, one
sequence of 512 tokens; training: one step of loss, backward and AdamW), ``dynamic`` (a 2-layer GPT-2 called with
10 different batch/sequence sizes: how many compiles each compiler makes), and ``import`` (``import
ember`` on top of ``import torch``).

Per (row, compiler) one process: ``cold`` with empty compiler caches, then ``warm`` in a second
process that finds the first one's caches (ember: ``EMBER_CACHE_DIR``+``TRITON_CACHE_DIR``; torch:
``TORCHINDUCTOR_CACHE_DIR``+``TRITON_CACHE_DIR``). Each process reports:

* ``import_s``: torch, the model's libraries, what torch's FakeTensorMode/make_fx import, and the
  compiler's own modules (ember's frontend, autograd layer and backend; torch._dynamo and
  torch._inductor) — the shared imports, reported apart;
* ``compile_s``: from wrapping the model to the first result (compile + first run), imports
  excluded: the compile time compared. Eager runs once before (inference: the reference output;
  training: one step of a twin model), so what any first call pays (CUDA context, cuBLAS handles,
  autograd's device threads, optimizer state) is not counted;
* ``peak_gb``: peak device memory (``torch.cuda.max_memory_allocated``; CPU: max RSS);
* ``err``: max |out - eager| / max |eager| of the first result (training: the loss);
* ``gc``: Python's cyclic collections during ``compile_s`` (seconds and count per generation: a full
  collection walks every object of the process, ~0.2-0.4 s with a 1B Llama and a compile's graphs);
* ember: ``aot_cache``/``native_cache`` hit counts, ``warm_launch`` (kernels adopted from recorded
  binaries vs through Triton's JIT), ``aot_graphs`` (cached graphs loaded unbuilt/built),
  ``build_pool`` (kernel builds in worker processes, the first launches' wait for them) and the auto
  CUDA-graph decisions;
* ``--phases`` (a diagnostic run: the phase modules are imported before timing, so ``compile_s``
  leaves their import out): wall seconds and calls of ember's compile phases (``PHASES``; nested
  phases count in their parents).

Python's bytecode is cached (``gpu_suite.child_env``), as on an installed system. Writes
``benchmarks/results/compile_time-<device>[-quick].json`` and prints a table with the ratio
ember/torch per row (the issue asks <= 1/3 cold, <= 1/5 for the Llama rows, warm <= 0.3 s for GPT-2).
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
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from _proc import run_measured  # noqa: E402

SUITE = ("overhead", "mlp", "ln_gelu", "softmax", "gpt2_infer", "gpt2_train", "bert_infer", "resnet50_infer",
         "resnet50_train", "vit_infer", "sd15_unet")
CPU_ROWS = ("overhead", "mlp", "ln_gelu", "softmax", "gpt2_infer", "gpt2_train", "bert_infer")
EXTRA = ("llama_infer", "llama_train", "dynamic")
COMPILERS = ("ember", "torch")
SWEEP = [(1, 32), (2, 48), (4, 64), (3, 80), (8, 96), (5, 112), (6, 128), (2, 160), (7, 192), (1, 224)]
QUICK_SWEEP = [(1, 8), (2, 12), (3, 16), (4, 20), (1, 24), (2, 28), (3, 32), (4, 36), (5, 40), (6, 44)]
# torch, and what its FakeTensorMode and make_fx import (a FakeTensorMode imports torch._dynamo when made)
SHARED = ("torch", "torch._subclasses.fake_tensor", "torch.fx.experimental.proxy_tensor", "torch._dynamo")
COMPILER_MODULES = {"ember": ("ember", "ember.frontend.cache", "ember.aot", "ember.native.backend"),
                    "torch": ("torch._dynamo", "torch._inductor.compile_fx")}


# ------------------------------------------------------------------------------------------ workloads

def llama(dev: str, quick: bool, train: bool, layers: int = 24):
    """(build(compiler) -> step, inputs) for the ~1B Llama (quick: 2 tiny layers; ``layers``: another
    depth of the same widths, for ``compile_profile.py``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    if quick:
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
        shape = (1, 16)
    else:
        cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers, num_attention_heads=32,
                          num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
        shape = (1, 512)
    cfg._attn_implementation = "sdpa"
    dtype = torch.float32 if quick and dev == "cpu" else torch.bfloat16
    m = LlamaForCausalLM(cfg).to(dev, dtype)
    ids = torch.randint(0, cfg.vocab_size, shape, device=dev)
    if not train:
        m.eval()

        def build(c):
            cm = c(m)

            def step(ids):
                with torch.no_grad():
                    return cm(ids).logits
            return step
        return build, (ids,)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, fused=dev.startswith("cuda"))

    def build(c):
        cm = c(m)

        def step(ids):
            loss = cm(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        return step
    return build, (ids,)


def make(row: str, dev: str, quick: bool):
    if row.startswith("llama"):
        return llama(dev, quick, row == "llama_train")
    from gpu_suite import make as suite_make
    build, inputs, _ = suite_make(row, dev, quick)
    return build, inputs


def compiler_fn(compiler: str, dynamic=None):
    if compiler == "eager":
        return lambda f: f
    if compiler == "ember":
        import ember
        return lambda f: ember.compile(f, dynamic=dynamic)
    import torch
    return lambda f: torch.compile(f, dynamic=dynamic)


# --------------------------------------------------------------------------------- one measured process

def _import(mods):
    import importlib
    for m in mods:
        try:
            importlib.import_module(m)
        except ImportError:
            pass


# (label, module, attribute): ember's phases, timed with --phases (cumulative wall s; nested ones count in their parents)
PHASES = (
    ("frontend: trace+compile (_compile)", "ember.frontend.convert", "_compile"),
    ("frontend: cache load", "ember.frontend.persist", "load"),
    ("frontend: cache key", "ember.frontend.persist", "key_of"),
    ("frontend: cache record", "ember.frontend.persist", "record_of"),
    ("frontend: cache store", "ember.frontend.persist", "store"),
    ("aot: build_variant", "ember.aot.pipeline", "build_variant"),
    ("aot: analysis.collect", "ember.aot.analysis", "collect"),
    ("aot: trace_forward_analyzed", "ember.aot.pipeline", "trace_forward_analyzed"),
    ("aot: trace_joint", "ember.aot.pipeline", "trace_joint"),
    ("aot: trace_joint_analyzed", "ember.aot.pipeline", "trace_joint_analyzed"),
    ("aot: cache load", "ember.aot.cache", "load"),
    ("aot: cache key", "ember.aot.cache", "key_of"),
    ("aot: mask_simplify", "ember.aot.mask_simplify", "simplify_attention_masks"),
    ("aot: cache store", "ember.aot.cache", "store"),
    ("native: compile_aten_graph", "ember.native.backend", "compile_aten_graph"),
    ("native: passes", "ember.native.passes", "run"),
    ("native: lower", "ember.native.lowering", "lower"),
    ("native: schedule", "ember.native.scheduler", "schedule"),
    ("native: emit triton", "ember.native.triton_emit", "emit_kernel"),
    ("native: wrapper", "ember.native.wrapper", "WrapperCodegen.generate"),
    ("native: load module", "ember.native.cache", "load_module"),
    ("native: adopt recorded kernels", "ember.native.warm_launch", "adopt_recorded"),
    ("native: precompile launches", "ember.native.runtime", "precompile"),
    ("native: wait for kernel builds", "ember.native.build_pool", "wait"),
)


def _time_phases(phases=PHASES, on_call=None):
    """Wrap each (label, module, attribute) of ``phases`` (a missing module or attribute is skipped)
    with a wall-clock timer; returns {label: [seconds, calls]} filled as they run. ``on_call(label,
    start, end)`` (perf_counter seconds; in the calling thread) also hears of each call."""
    import functools
    import importlib
    got: dict = {}
    for label, modname, attr in phases:
        try:
            owner = importlib.import_module(modname)
        except ImportError:
            continue
        name = attr
        if "." in attr:
            cls, name = attr.split(".")
            owner = getattr(owner, cls, None)
        f = getattr(owner, name, None) if owner is not None else None
        if f is None:
            continue

        def make(f, label):
            @functools.wraps(f)
            def timed(*a, **k):
                t = time.perf_counter()
                try:
                    return f(*a, **k)
                finally:
                    end = time.perf_counter()
                    slot = got.setdefault(label, [0.0, 0])
                    slot[0] += end - t
                    slot[1] += 1
                    if on_call is not None:
                        on_call(label, t, end)
            return timed
        setattr(owner, name, make(f, label))
    return got


def _gc_timer():
    """(callback, {generation: [seconds, collections]}): Python's cyclic collections while installed."""
    got: dict = {}
    start = [0.0]

    def cb(phase, info):
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            slot = got.setdefault(f"gen{info['generation']}", [0.0, 0])
            slot[0] += time.perf_counter() - start[0]
            slot[1] += 1
    return cb, got


def _peak(dev: str) -> float:
    import torch
    if dev.startswith("cuda"):
        return round(torch.cuda.max_memory_allocated() / 2**30, 3)
    import resource
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def child(row: str, compiler: str, dev: str, quick: bool, phases: bool = False) -> dict:
    t0 = time.perf_counter()
    _import(SHARED)
    if row.startswith(("gpt2", "bert", "llama", "dynamic")):
        _import(("transformers",))
    t1 = time.perf_counter()
    _import(COMPILER_MODULES[compiler])
    t2 = time.perf_counter()
    import torch
    cuda = dev.startswith("cuda")
    if not cuda:
        torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = True

    def sync():
        if cuda:
            torch.cuda.synchronize()
    if row == "dynamic":
        return dict(_sweep(compiler, dev, quick, sync), import_s=round(t1 - t0, 3), compiler_import_s=round(t2 - t1, 3))
    torch.manual_seed(0)
    build, inputs = make(row, dev, quick)
    with torch.no_grad():
        ref = None if row.endswith("_train") else build(lambda f: f)(*inputs)
    if row.endswith("_train"):
        # one eager step on a twin model first, as the inference rows run eager first: what any first
        # training step pays (cuBLAS handles, autograd's device threads, the optimizer's state) is not
        # compile time; the measured model keeps its weights
        twin_build, twin_inputs = make(row, dev, quick)
        twin_build(lambda f: f)(*twin_inputs)
        del twin_build, twin_inputs
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    import gc
    timed = _time_phases() if phases and compiler == "ember" else None
    gc_cb, gc_got = _gc_timer()
    gc.callbacks.append(gc_cb)
    t3 = time.perf_counter()
    step = build(compiler_fn(compiler))
    torch.manual_seed(1)
    out = step(*inputs)
    sync()
    compile_s = time.perf_counter() - t3
    gc.callbacks.remove(gc_cb)
    rec = dict(row=row, compiler=compiler, status="ok", import_s=round(t1 - t0, 3),
               compiler_import_s=round(t2 - t1, 3), compile_s=round(compile_s, 3), peak_gb=_peak(dev),
               gc={g: [round(v[0], 3), v[1]] for g, v in sorted(gc_got.items())})
    if timed is not None:
        rec["phases"] = {k: [round(v[0], 3), v[1]] for k, v in timed.items()}
    if ref is not None:
        d = (out.float() - ref.float()).abs().max().item()
        rec["err"] = d / (ref.float().abs().max().item() or 1.0)
    rec.update(_compile_counts(compiler))
    return rec


def _compile_counts(compiler: str) -> dict:
    if compiler == "ember":
        from ember.backends import regional
        from ember.diagnostics import counters
        from ember.frontend import persist
        rec = dict(frames_traced=counters.COMPILES["frames_compiled"], frames_loaded=counters.COMPILES["frames_loaded"],
                   frontend_cache={k: v for k, v in persist.STATS.items() if v},
                   regional=dict(regional.stats()))  # splits/compiles/reuses: was regional compilation chosen
        rec.update(_ember_details())
        return rec
    from torch._dynamo.utils import counters
    return dict(frames_traced=int(counters["stats"]["unique_graphs"]))


def _ember_details() -> dict:
    """Where an ember first call's work went: cache hits, kernels adopted or built, build waits (the
    modules already loaded only: reading them imports nothing)."""
    out = {}
    mods = sys.modules
    if "ember.aot.cache" in mods:
        out["aot_cache"] = {k: v for k, v in mods["ember.aot.cache"].STATS.items() if v}
    if "ember.aot.deferred" in mods:
        out["aot_graphs"] = dict(mods["ember.aot.deferred"].STATS)
    if "ember.native.warm_launch" in mods:
        out["warm_launch"] = dict(mods["ember.native.warm_launch"].STATS)
    if "ember.native.build_pool" in mods:
        out["build_pool"] = {k: v for k, v in mods["ember.native.build_pool"].STATS.items() if v}
    if "ember.native.backend" in mods:
        out["native"] = dict(getattr(mods["ember.native.backend"], "COUNTERS", {}))
    if "ember.cudagraphs.auto" in mods:
        out["auto_cudagraphs"] = [[str(x) for x in d] for d in getattr(mods["ember.cudagraphs.auto"], "DECISIONS", [])]
    return out


def _sweep(compiler: str, dev: str, quick: bool, sync) -> dict:
    """A 2-layer GPT-2 called with 10 batch/sequence sizes: compiles made, total time."""
    import torch
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(n_layer=2, n_embd=64 if quick else 768, n_head=4 if quick else 12, vocab_size=128 if quick else 50257,
                     n_positions=256)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    m = GPT2Model(cfg).to(dev).eval()
    cm = compiler_fn(compiler)(m)
    t = time.perf_counter()
    errs = []
    for b, s in (QUICK_SWEEP if quick else SWEEP):
        ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)
        with torch.no_grad():
            out = cm(ids).last_hidden_state
            ref = m(ids).last_hidden_state
        errs.append((out - ref).abs().max().item())
    sync()
    rec = dict(row="dynamic", compiler=compiler, status="ok", compile_s=round(time.perf_counter() - t, 3),
               sizes=len(SWEEP), err=max(errs), peak_gb=_peak(dev))
    rec.update(_compile_counts(compiler))
    if compiler == "ember":
        from ember.diagnostics import counters
        rec["recompiles"] = counters.COMPILES["recompiles"]
    return rec


def import_cost(reps: int = 3) -> dict:
    """``import ember`` on top of ``import torch`` (median of ``reps`` fresh processes)."""
    import subprocess
    code = ("import time;t=time.perf_counter();import torch;t1=time.perf_counter();import ember;"
            "t2=time.perf_counter();print(t1-t, t2-t1)")
    torch_s, ember_s = [], []
    for _ in range(reps):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
        a, b = map(float, p.stdout.split())
        torch_s.append(a)
        ember_s.append(b)
    return dict(row="import", status="ok", import_torch_s=round(statistics.median(torch_s), 3),
                import_ember_beyond_torch_s=round(statistics.median(ember_s), 3))


# ------------------------------------------------------------------------------------------ the driver

ENV: dict = {}


def run_row(row: str, args) -> list:
    out = []
    tmp = tempfile.mkdtemp(prefix=f"compile_time_{row}_")
    try:
        for compiler in args.compilers.split(","):
            env = dict(ENV)
            if compiler == "torch":
                env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
                           TRITON_CACHE_DIR=os.path.join(tmp, "triton-torch"))
            else:
                env.update(EMBER_CACHE_DIR=os.path.join(tmp, "ember"), TRITON_CACHE_DIR=os.path.join(tmp, "triton-ember"))
            cmd = [sys.executable, os.path.abspath(__file__), "--child", row, compiler, "--device", args.device]
            if args.quick:
                cmd.append("--quick")
            if args.phases:
                cmd.append("--phases")
            phases = ("cold",) if row == "dynamic" else tuple(
                (args.torch_phases if compiler == "torch" else "cold,warm").split(","))
            for phase in phases:
                rec = run_measured(cmd, env, ROOT, args.timeout, dict(row=row, compiler=compiler))
                rec["phase"] = phase
                print(_line(rec), flush=True)
                out.append(rec)
                if rec.get("status") != "ok":
                    break
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _line(r: dict) -> str:
    head = f"{r.get('row', ''):<15} {r.get('compiler', ''):<6} {r.get('phase', ''):<5}"
    if r.get("status") != "ok":
        return f"{head} {r.get('status')}: {r.get('error', '')}"
    if r.get("row") == "import":
        return f"import torch {r['import_torch_s']:.3f} s, import ember beyond it {r['import_ember_beyond_torch_s']:.3f} s"
    extra = f" compiles {r['frames_traced']}" + (f" (+{r['frames_loaded']} loaded)" if r.get("frames_loaded") else "")
    err = f" err {r['err']:.2e}" if isinstance(r.get("err"), float) else ""
    full = (r.get("gc") or {}).get("gen2")
    err += f" (full gc x{full[1]} {full[0]:.2f} s)" if full else ""
    return (f"{head} imports {r.get('import_s', 0):6.2f}+{r.get('compiler_import_s', 0):5.2f} s  compile "
            f"{r['compile_s']:8.3f} s  peak {r.get('peak_gb', 0):7.3f} GB{extra}{err}")


def summary(rows: list) -> list:
    """Per row: ember/torch ratios of cold and warm compile time."""
    by = {(r.get("row"), r.get("compiler"), r.get("phase")): r for r in rows if r.get("status") == "ok"}
    out = []
    for row in dict.fromkeys(r.get("row") for r in rows):
        line = {"row": row}
        for phase in ("cold", "warm"):
            e, t = by.get((row, "ember", phase)), by.get((row, "torch", phase))
            if e:
                line[f"ember_{phase}_s"] = e["compile_s"]
            if t:
                line[f"torch_{phase}_s"] = t["compile_s"]
            if e and t and t["compile_s"]:
                line[f"ratio_{phase}"] = round(e["compile_s"] / t["compile_s"], 3)
        if len(line) > 1:
            out.append(line)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny shapes: a smoke run of every code path")
    p.add_argument("--workloads", default=None, help="comma list of rows (default: all for the device)")
    p.add_argument("--compilers", default=",".join(COMPILERS))
    p.add_argument("--no-import", action="store_true", help="skip the import-cost row")
    p.add_argument("--torch-phases", default="cold,warm", help="torch.compile's processes per row ('cold': no "
                   "warm-cache process, to save time on big rows)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default=None)
    p.add_argument("--label", default="", help="a note on the machine stored with the results")
    p.add_argument("--phases", action="store_true", help="diagnostic: time ember's compile phases (their modules "
                   "are imported before timing, so compile_s leaves their import out)")
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(child(a.child[0], a.child[1], a.device, a.quick, a.phases)), flush=True)
        return 0
    from gpu_suite import child_env
    tmp = tempfile.mkdtemp(prefix="compile_time_env_")
    ENV.update(child_env(tmp))
    rows = []
    try:
        if not a.no_import:
            rec = import_cost()
            print(_line(rec), flush=True)
            rows.append(rec)
        default = (CPU_ROWS if a.device == "cpu" else SUITE) + EXTRA
        for row in (a.workloads.split(",") if a.workloads else default):
            rows += run_row(row, a)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    import torch
    dev_name = (torch.cuda.get_device_name() if a.device.startswith("cuda") and torch.cuda.is_available()
                else platform.processor() or "cpu")
    result = dict(benchmark="benchmarks/compile_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  device=a.device, device_name=dev_name, label=a.label, torch=torch.__version__,
                  python=platform.python_version(), loadavg_1m=round(os.getloadavg()[0], 2), cpus=os.cpu_count(),
                  summary=summary(rows), rows=rows)
    name = f"compile_time-{'cpu' if a.device == 'cpu' else dev_name.lower().replace(' ', '-')}{'-quick' if a.quick else ''}.json"
    out = a.out or os.path.join(HERE, "results", name)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print("\n| row | ember cold s | torch cold s | cold ratio | ember warm s | torch warm s | warm ratio |")
    print("|---|---|---|---|---|---|---|")
    for s in result["summary"]:
        print(f"| {s['row']} | {s.get('ember_cold_s', '')} | {s.get('torch_cold_s', '')} | {s.get('ratio_cold', '')} | "
              f"{s.get('ember_warm_s', '')} | {s.get('torch_warm_s', '')} | {s.get('ratio_warm', '')} |")
    print(f"\nwrote {out}")
    bad = [r for r in rows if r.get("status") != "ok" and r.get("compiler") == "ember"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
