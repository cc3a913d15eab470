"""Probe (H100): normalization backward, eager vs ember vs torch.compile (issues 28/29/31).

The weight (and bias) gradient of a norm is a sum down the rows per column; session 37 ran it as one
persistent program per column, every load strided (Llama-1.1B's RMSNorm backward: 0.70 ms per
launch). Cases, one training step each (forward + backward, gradients compared with eager):
  rmsnorm      HF LlamaRMSNorm(2048), bf16 weight, x [4096, 2048] bf16         (Llama-1.1B, b8 x 512)
  layernorm    nn.LayerNorm(768) fp32 under bf16 autocast, x [8, 512, 768] fp32 (GPT-2's residual stream)
  gpt2_block   transformers' GPT2Block under bf16 autocast, x [8, 512, 768]
  llama_layer  transformers' LlamaDecoderLayer (1.1B widths) in bf16, x [8, 512, 2048]
Compilers: eager, ember, ember_s37 (session 37's rule for which reductions are strided: the
norms' column sums unsplit, the before of this fix), torch.compile (default mode).
Per (case, compiler): the step's time (CUDA events, median of 3 loops), its device time per step
(sum of the kernels in a torch.profiler trace of 5 steps) and the top kernels (us per launch).
Then ember's split of the column sums is swept on rmsnorm and layernorm (rows per chunk of the
partial kernel; the partial kernel's XBLOCK, RBLOCK, num_warps), by patching
split_reduction.split_count and triton_emit.choose_config in this process (fresh caches per variant);
each variant's device time per step comes from the profiler.

usage (H100, < 3 min):   python benchmarks/probes/norm_backward.py --out /tmp/norm_backward.json
  --only A,B      cases whose name contains A or B;  --sweep A,B  the cases swept (default rmsnorm,layernorm;
                  gpt2_block,llama_layer sweep their column sums' partial kernels in situ: the GELU
                  backward + bias gradient, the two RMSNorm weight gradients with 9 streams)
  --budget S      stop the sweep after S seconds (90;
                  the blocks run after it unless 60 s past it)
  --no-torch      skip torch.compile (its compiles take the most time)
  --smoke         CPU check (Triton interpreter, tiny shapes): ember matches eager; no timing
  the blocks' partial kernels (~3 min):  ... --only gpt2_block,llama_layer --sweep gpt2_block,llama_layer
                  --no-torch --budget 150
Results of session 38's run: benchmarks/results/norm_backward-nvidia-h100-s38.{json,txt}.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

if "--smoke" in sys.argv:  # before torch/triton load: the interpreter is chosen at triton's import
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("EMBER_NATIVE_FORCE_TRITON", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import ember  # noqa: E402
import ember.native.split_reduction as sr  # noqa: E402
import ember.native.triton_emit as te  # noqa: E402

CHUNKS = [64, 128, 256, 512, 1024]                               # rows per chunk of the partial kernel
CONFIGS = [(64, 64, 8), (64, 32, 4), (64, 16, 4), (32, 64, 4), (64, 64, 4), (64, 32, 8), (128, 32, 8),
           (128, 16, 4), (32, 128, 8)]
SMOKE_CHUNKS, SMOKE_CONFIGS = [16, 32], [(16, 16, 4), (32, 8, 2)]
SWEPT = ("rmsnorm", "layernorm")


# ---- the cases ---------------------------------------------------------------------------------------
def make_case(name, smoke, device):
    """(module, x, grad, autocast?) at the case's shape (tiny under --smoke)."""
    torch.manual_seed(0)
    if name == "rmsnorm":
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        h, rows = (64, 96) if smoke else (2048, 4096)
        m = LlamaRMSNorm(h).to(device, torch.bfloat16)
        with torch.no_grad():
            m.weight.copy_(torch.randn(h) * 0.1 + 1)
        shape, dt, amp = (rows, h), torch.bfloat16, False
    elif name == "layernorm":
        h, b, t = (48, 4, 24) if smoke else (768, 8, 512)
        m = torch.nn.LayerNorm(h).to(device)
        with torch.no_grad():
            m.weight.copy_(torch.randn(h) * 0.1 + 1)
            m.bias.copy_(torch.randn(h) * 0.1)
        shape, dt, amp = (b, t, h), torch.float32, True
    elif name == "gpt2_block":
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block
        cfg = (GPT2Config(n_embd=64, n_head=4, n_positions=64) if smoke else GPT2Config())
        cfg.attn_pdrop = cfg.embd_pdrop = cfg.resid_pdrop = 0.0
        cfg._attn_implementation = "sdpa"
        m = GPT2Block(cfg).to(device)
        shape, dt, amp = ((2, 32, 64) if smoke else (8, 512, 768)), torch.float32, True
    elif name == "llama_layer":
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        cfg = (LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                           num_hidden_layers=1) if smoke else
               LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=1, num_attention_heads=32,
                           num_key_value_heads=4, max_position_embeddings=2048, rope_theta=10000.0))
        cfg._attn_implementation = "sdpa"
        m = LlamaDecoderLayer(cfg, 0).to(device, torch.bfloat16)
        m.rope = _rope(cfg, device)
        shape, dt, amp = ((2, 32, 64) if smoke else (8, 512, cfg.hidden_size)), torch.bfloat16, False
    else:
        raise SystemExit(f"unknown case {name!r}")
    x = torch.randn(shape, device=device).to(dt)
    grad = torch.randn(shape, device=device).to(dt)
    return m, x, grad, amp


def _rope(cfg, device):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    return LlamaRotaryEmbedding(cfg).to(device)


def forward(m, x):
    if hasattr(m, "rope"):  # the decoder layer takes the rotary embedding's (cos, sin)
        pos = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        y = m(x, position_embeddings=m.rope(x, pos), position_ids=pos)
    else:
        y = m(x)
    return y[0] if isinstance(y, tuple) else y


def step_fn(m, device, amp, compiler):
    """A training step's forward compiled (as benchmarks/distributed.py: autocast around the call,
    backward outside it)."""
    fwd = lambda x: forward(m, x)  # noqa: E731
    if compiler == "torch":
        fwd = torch.compile(fwd)
    elif compiler == "ember":
        ember.reset()
        ember.config.cache_dir = tempfile.mkdtemp(prefix="norm_bwd_")  # (no entry of another variant)
        fwd = ember.compile(fwd, options={"force_disable_caches": True})

    def step(x, grad):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            y = fwd(x)
        y.backward(grad)
    return step


def run_step(fn, m, x, grad):
    """One step from zeroed gradients; returns (x.grad, param grads)."""
    x = x.detach().requires_grad_(True)
    for p in m.parameters():
        p.grad = None
    fn(x, grad)
    return [x.grad] + [p.grad for p in m.parameters()]


def rel_err(got, want):
    worst = 0.0
    for g_, w_ in zip(got, want, strict=True):
        if w_ is None:
            continue
        g_, w_ = g_.float(), w_.float()
        worst = max(worst, (g_ - w_).abs().max().item() / (w_.abs().max().item() + 1e-6))
    return worst


# ---- forcing ember's choices (as benchmarks/probes/outer_reduction.py) --------------------------------
SMOKE_OPTS: dict = {}
FORCE: dict = {}  # "chunk": rows per chunk of strided split reductions; "cfg": (XBLOCK, RBLOCK, num_warps)
SEEN: dict = {}   # "S": split counts of strided reductions; "cfg": partial kernels' configs
_split_count, _choose_config = sr.split_count, te.choose_config


def split_count(n, ranges, reduced, body, options, *more, **kw):
    if SMOKE_OPTS:
        options = dataclasses.replace(options, **SMOKE_OPTS)
    s = _split_count(n, ranges, reduced, body, options, *more, **kw)
    vs = sr.ir.node_vars(len(ranges))
    strided = not contiguous_reduction(body, vs[reduced[-1]], dict(zip(vs, ranges)))
    if strided and "chunk" in FORCE and n.reduction_type in sr.SPLITTABLE and s > 1:
        size = ranges[reduced[0]]
        s = max(2, min(-(-size // FORCE["chunk"]), size // 2))
    if strided:
        SEEN.setdefault("S", []).append(s)
    return s


def choose_config(k, options, inner, persistent_ok=True, **kw):
    cfg = _choose_config(k, options, inner, persistent_ok, **kw)
    partial = any(n.name.endswith("_partial") for n in getattr(k, "nodes", ()))
    if k.is_reduction and not inner and partial:
        if "cfg" in FORCE:
            xb, rb, w = FORCE["cfg"]
            cfg = te.LaunchConfig(min(xb, te.next_pow2(k.xnumel)), min(rb, te.next_pow2(k.rnumel)), w, False)
        SEEN.setdefault("cfg", []).append((cfg.XBLOCK, cfg.RBLOCK, cfg.num_warps, int(k.xnumel), int(k.rnumel)))
    return cfg


_contiguous = sr.contiguous_reduction


def contiguous_reduction(body, last_var, sizes=None):
    """FORCE["old"]: session 37's rule, the first load that depends on the loop decides (a per-row
    vector such as rstd made the norms' column sums look contiguous: unsplit, one program per column)."""
    if FORCE.get("old"):
        for ld in sr.ir.loads_of(body):
            index = sr.sympy.expand(ld.attr[1])
            if last_var in index.free_symbols:
                return index.coeff(last_var) == 1
        return True
    return _contiguous(body, last_var, sizes)


_kernel_name = te.kernel_name


def kernel_name(k, kind, i):
    """Notes the names of the partial kernels (of split reductions), to find them in the profile."""
    name = _kernel_name(k, kind, i)
    if any(n.name.endswith("_partial") for n in k.nodes):
        SEEN.setdefault("partial_names", set()).add(name[:90])
    return name


def partial_us(kernels) -> float:
    """us per step of the partial kernels this compile made (SEEN["partial_names"])."""
    names = SEEN.get("partial_names", set())
    return round(sum(v[0] for k, v in kernels.items() if k in names), 1)


sr.split_count, te.choose_config, te.kernel_name = split_count, choose_config, kernel_name
sr.contiguous_reduction = te.contiguous_reduction = contiguous_reduction


# ---- timing ------------------------------------------------------------------------------------------
def loop_ms(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record(); fn(); e.record(); e.synchronize()
    n = max(3, min(200, int(30 / max(s.elapsed_time(e), 1e-3))))
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(n):
            fn()
        e.record(); e.synchronize()
        out.append(s.elapsed_time(e) / n)
    return statistics.median(out), min(out), max(out)


def kernel_profile(fn, steps=5):
    """{kernel name: [us per step, launches per step]} and the device time per step (ms)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path)).get("traceEvents", [])
    kernels: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            k = kernels.setdefault(e["name"][:90], [0.0, 0])
            k[0] += e["dur"] / steps
            k[1] += 1 / steps
    return kernels, sum(v[0] for v in kernels.values()) / 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget", type=float, default=90.0)
    ap.add_argument("--only", default=None)
    ap.add_argument("--sweep", default=",".join(SWEPT))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-torch", action="store_true", help="skip torch.compile (its compiles take the most time)")
    a = ap.parse_args()
    smoke = a.smoke
    device = "cpu" if smoke else "cuda"
    warnings.filterwarnings("error", message="ember")  # a graph run eagerly must not pass as a measurement
    if smoke:
        SMOKE_OPTS.update(split_reduction_programs=16, split_reduction_numel=64, single_program_numel=64,
                          split_outer_rows=9)
    t0 = time.time()
    results = {"device": torch.cuda.get_device_name() if not smoke else "cpu-interpreter",
               "torch": torch.__version__, "records": []}
    names = ["rmsnorm", "layernorm", "gpt2_block", "llama_layer"]
    names = [n for n in names if not a.only or any(o in n for o in a.only.split(","))]
    swept = [n for n in names if n in a.sweep.split(",")]
    compilers = ["eager", "ember", "ember_s37"] + ([] if smoke or a.no_torch else ["torch"])
    table = []

    def run_base(name):
        base, x, grad, amp = make_case(name, smoke, device)
        want = run_step(step_fn(base, device, amp, "eager"), base, x, grad)
        for comp in compilers:
            m = copy.deepcopy(base)
            FORCE.clear(); SEEN.clear()
            FORCE["old"] = comp == "ember_s37"  # (session 37's classification, for the before/after)
            t1 = time.time()
            try:
                fn = step_fn(m, device, amp, "ember" if comp == "ember_s37" else comp)
                got = run_step(fn, m, x, grad)
            except Exception as ex:  # (a warning turned error: a graph run eagerly; a compile failure)
                results["records"].append({"kind": "base", "case": name, "compiler": comp, "error": repr(ex)[:500]})
                print(f"{name:11s} {comp:6s} FAILED: {ex!r}"[:400], flush=True)
                continue
            r = {"kind": "base", "case": name, "compiler": comp, "err": rel_err(got, want),
                 "compile_s": time.time() - t1, "S": SEEN.get("S"), "cfg": SEEN.get("cfg")}
            if not smoke:
                call = lambda: run_step(fn, m, x, grad)  # noqa: E731
                r["ms"], r["ms_min"], r["ms_max"] = loop_ms(call)
                kernels, r["device_ms"] = kernel_profile(call)
                r["partial_us"] = partial_us(kernels)
                r["top"] = [(k, round(v[0], 1), round(v[1], 2)) for k, v in
                            sorted(kernels.items(), key=lambda kv: -kv[1][0])[:8]]
                print(f"[{time.time() - t0:4.0f}s] {name:11s} {comp:6s} step {r['ms']:.3f} ms "
                      f"(device {r['device_ms']:.3f}; partial kernels {r['partial_us']} us)  err {r['err']:.1e}  S={r['S']} "
                      f"cfg={r['cfg']}", flush=True)
                for k, us, n in r["top"][:5]:
                    print(f"      {us:8.1f} us/step  {n:4.1f} launches  {us / max(n, 1e-9):8.1f} us each  {k}")
            else:
                print(f"{name:11s} {comp:6s} err {r['err']:.1e} S={r['S']} cfg={r['cfg']}", flush=True)
            results["records"].append(r)
            table.append(r)
            if comp == "torch":
                torch._dynamo.reset()
    for name in swept:
        run_base(name)
    # the sweep: configs at the heuristic chunk, then chunk sizes at the heuristic config
    chunks, configs = (SMOKE_CHUNKS, SMOKE_CONFIGS) if smoke else (CHUNKS, CONFIGS)
    plan = [dict(cfg=c) for c in configs] + [dict(chunk=c) for c in chunks]  # (configs first: the blocks)
    if not smoke:  # short chunks with smaller tiles (GPT-2's 768 columns: 12 programs per chunk)
        plan += [dict(chunk=128, cfg=c) for c in [(64, 32, 4), (32, 64, 4), (32, 32, 4)]]
    stopped = False
    for v in plan:
        for name in swept:
            if not smoke and time.time() - t0 > a.budget:
                stopped = True
                break
            base, x, grad, amp = make_case(name, smoke, device)
            want = run_step(step_fn(base, device, amp, "eager"), base, x, grad)
            m = copy.deepcopy(base)
            FORCE.clear(); SEEN.clear(); FORCE.update(v)
            tag = f"{name} {v}"
            try:
                fn = step_fn(m, device, amp, "ember")
                got = run_step(fn, m, x, grad)
            except Exception as ex:  # a config Triton cannot compile: noted
                results["records"].append({"kind": "sweep", "case": name, **v, "error": repr(ex)[:300]})
                print(f"  {tag}: {ex!r}"[:240], flush=True)
                continue
            r = {"kind": "sweep", "case": name, **v, "err": rel_err(got, want), "S": SEEN.get("S"),
                 "seen": SEEN.get("cfg")}
            if not smoke:
                call = lambda: run_step(fn, m, x, grad)  # noqa: E731
                kernels, r["device_ms"] = kernel_profile(call)
                r["partial_us"] = partial_us(kernels)
                r["ms"] = loop_ms(call)[0]
                print(f"  [{time.time() - t0:4.0f}s] {tag:40s} S={r['S']} cfg={r['seen']}: device "
                      f"{r['device_ms']:.4f} ms/step (partial kernels {r['partial_us']} us), step {r['ms']:.3f} ms  "
                      f"err {r['err']:.1e}", flush=True)
            else:
                print(f"  {tag} S={r['S']} err {r['err']:.1e}", flush=True)
            results["records"].append(r)
        if stopped:
            print("budget reached", flush=True)
            break
    for name in [n for n in names if n not in swept]:  # the blocks: kernels in situ
        if not smoke and time.time() - t0 > a.budget + 60:
            print(f"skipped {name}: past the budget", flush=True)
            continue
        run_base(name)
    if not smoke:
        print("\nstep ms (device ms per step from the profiler)")
        print(f"{'case':12s} " + " ".join(f"{c:>18s}" for c in compilers))
        for name in names:
            rows = {r["compiler"]: r for r in table if r["case"] == name}
            if not rows:
                continue
            print(f"{name:12s} " + " ".join(f"{rows[c]['ms']:8.3f} ({rows[c]['device_ms']:7.3f})" if c in rows
                                           else f"{'-':>18s}" for c in compilers))
        for name in swept:
            sw = sorted((r for r in results["records"] if r["kind"] == "sweep" and r["case"] == name and "device_ms" in r),
                        key=lambda r: r["device_ms"])[:3]
            base_ember = next((r for r in table if r["case"] == name and r["compiler"] == "ember"), {"device_ms": 0})
            print(f"{name}: ember heuristic {base_ember['device_ms']:.4f} ms device; best sweep: " +
                  "; ".join(f"{r['device_ms']:.4f} chunk={r.get('chunk')} cfg={r.get('cfg')}" for r in sw))
    bad = [r for r in results["records"] if (r.get("err") or 0) > 5e-2 or (r["kind"] == "base" and "error" in r)]
    print(f"\n{len(results['records'])} records, {len(bad)} above 5e-2 relative error; {time.time() - t0:.0f}s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        print("wrote", a.out)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
