"""Probe (H100): the last percent of the memory-bound rows, and ResNet-50's max-pool backward (issue 28).

Sections (each prints a table; everything goes to --out as JSON):

  ln_gelu      layer_norm + erf-GELU over 8192 x 4096 bf16 (gpu_suite's ln_gelu row). Eager,
               torch.compile, ember as compiled (the config it picks today is printed), and ember's
               *own generated kernel* recompiled with forced launch configs (XBLOCK rows per
               program, num_warps) and source variants: ember's PERSISTENT_HINTS (L2 eviction hints
               on the row and weight loads, "evict"; a streaming store, "store_cs"), erf replaced by
               its argument ("no_erf": the floor of the compute cost, wrong values on purpose, not
               a candidate), and ember's kernel launched directly, as emitted and as a grid-stride
               loop over rows with SMs x k programs. Every number is GB/s (read x + write y), % of
               the device's copy peak (_gpu_metrics.device_peaks, 1 GiB y.copy_(x): gpu_suite's "%
               of copy peak", the issue's 92% target; the headline column) and % of y.copy_(x) of
               the same tensor, all timed in the same process.
  widths       the same at D = 768 ... 8192 (~the same bytes), fewer configs: so the rule found is
               a table over row widths, not a special case (as the budget allows; alone:
               --only widths).
  bn_stats     var_mean over (0, 2, 3) of 64x256x56x56 bf16 channels-last (.float()): BatchNorm's
               forward statistics (benchmarks/probes/outer_reduction.py's fwd_stats). Ember today,
               with the partial kernel's config forced to (XBLOCK, RBLOCK, num_warps) = (32, 64, 4)
               and (64, 32, 4), at today's chunk and at 2048 / 1024 rows per chunk, eviction hints on
               and off; torch.compile and eager beside. Then 64x112x112 and 512x28x28 (today's chunk,
               today's tile vs (32, 64, 4), hints on/off): the shapes a new tile row would also reach.
  maxpool_bwd  max_pool2d_with_indices_backward of 64x64x112x112 bf16 channels-last (3x3, stride 2,
               pad 1: ResNet-50's stem): eager (ATen's max_pool_backward_nhwc), torch.compile, ember;
               exact equality with eager checked (on the GPU: ATen's CUDA kernels also sum in float32,
               in the same order; under --smoke eager's CPU kernel rounds bf16 after each add, so
               bf16 differs there by a rounding step), and the CUDA kernels of ember's call listed
               (an ATen max_pool kernel there: the native lowering did not apply).

Timing: CUDA-graph replays of 10 calls, timed with CUDA events (outer_reduction.cuda_ms; falls back to
plain loops); the headline rows are measured in 3 interleaved rounds (median, [min, max]).

usage (H100, ~1.5-2 min):   python benchmarks/probes/ln_gelu_sweep.py --out /tmp/ln_gelu_sweep.json
  the other widths (~1-2 min): python benchmarks/probes/ln_gelu_sweep.py --only widths --budget 100 --out /tmp/w.json
  --budget S   start no further width after S seconds from the start (default 100)
  --only A,B   only these sections: ln_gelu (8192x4096), bn_stats, maxpool_bwd, widths (the other D);
               e.g. the widths alone, with their own budget: --only widths --budget 110
  --smoke      CPU check (Triton interpreter, tiny shapes): every variant runs and matches; no timing
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import sys
import tempfile
import time
import warnings

if "--smoke" in sys.argv:  # before torch/triton load: the interpreter is chosen at triton's import
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("EMBER_NATIVE_FORCE_TRITON", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402
import ember.native.triton_emit as te  # noqa: E402
from ember.native import backend  # noqa: E402
from benchmarks.probes import outer_reduction as orr  # noqa: E402  (patches split_count/choose_config: no-ops unless FORCE)

aten = torch.ops.aten
SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
# (XBLOCK, num_warps) of the persistent row kernel; None = ember's own choice
LN_CONFIGS = [(1, 2), (1, 4), (1, 8), (1, 16), (2, 4), (2, 8), (2, 16), (4, 8)]
LN_WIDTH_CONFIGS = [(1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (4, 4), (4, 8)]
WIDTHS = [(32768, 768), (32768, 1024), (16384, 2048), (4096, 8192)]  # (rows, D) beside 8192 x 4096
# source variants: PERSISTENT_HINTS tables (ember emits them; the first two only by hand, --only
# ln_gelu with LN_HINTS_ALL=1) and "no_erf" (a text edit)
HINTS = {"rows-first": {"rows": "evict_first"}, "shared-last": {"shared": "evict_last"},
         "evict": {"rows": "evict_first", "shared": "evict_last"}, "store_cs": {"store": ".cs"},
         "evict+store_cs": {"rows": "evict_first", "shared": "evict_last", "store": ".cs"}}
# (programs per SM, num_warps, num_stages: None = Triton's default, which pipelines the next row's loads)
GRID_STRIDE = [(2, 4, None), (4, 4, None), (8, 4, None), (4, 4, 1), (2, 8, None), (4, 8, None), (4, 8, 1)]


# ---- timing ---------------------------------------------------------------------------------------
def gpu_ms(fn):
    if SMOKE:
        fn()
        return float("nan")
    return orr.cuda_ms(fn)


def interleaved(runs: dict, rounds=3) -> dict:
    """{name: (median ms, [min, max])} of rounds of each fn in turn (drift hits all alike)."""
    got = {k: [] for k in runs}
    for _ in range(1 if SMOKE else rounds):
        for k, f in runs.items():
            got[k].append(gpu_ms(f))
    return {k: (statistics.median(v), [min(v), max(v)]) for k, v in got.items()}


def max_err(got, want):
    return (got.float() - want.float()).abs().max().item()


# ---- forcing ember's choices for the persistent row kernel ----------------------------------------
LN_FORCE: dict = {}   # "cfg": (XBLOCK, num_warps); "src": source variant name
LN_SEEN: dict = {}    # what ember chose / emitted for the last compile
_choose, _emit = te.choose_config, te.emit_kernel


def choose_config(k, options, inner, persistent_ok=True, **kw):
    cfg = _choose(k, options, inner, persistent_ok, **kw)
    if k.is_reduction and inner and cfg.persistent:
        LN_SEEN["default_cfg"] = (cfg.XBLOCK, cfg.RBLOCK, cfg.num_warps)
        if "cfg" in LN_FORCE:
            xb, w = LN_FORCE["cfg"]
            cfg = te.LaunchConfig(min(xb, te.next_pow2(int(k.xnumel))), cfg.RBLOCK, w, True)
        LN_SEEN["cfg"] = (cfg.XBLOCK, cfg.RBLOCK, cfg.num_warps)
    return cfg


def transform(src: str, variant: str) -> str:
    """"no_erf": erf replaced by its argument in ember's kernel text (the floor of the compute cost)."""
    return re.sub(r"erf_rational\(([^()]*)\)", r"(\1)", src) if variant == "no_erf" else src


def emit_kernel(k, layouts, options, sv=None):
    te.PERSISTENT_HINTS = HINTS.get(LN_FORCE.get("src"), {})  # (ember's own hints, set per variant)
    try:
        ek = _emit(k, layouts, options, sv)
    finally:
        te.PERSISTENT_HINTS = {}
    if ek.kind == "per":
        if "src" in LN_FORCE:
            ek.source = transform(ek.source, LN_FORCE["src"])
        LN_SEEN["ek"] = ek
    return ek


te.choose_config, te.emit_kernel = choose_config, emit_kernel


def ember_fn(fn):
    return orr.ember_fn(fn)  # fresh: caches off, so each variant compiles its own kernels


# ---- a grid-stride version of ember's kernel, launched directly --------------------------------------
def grid_stride_source(src: str, xnumel: int, programs: int, xblock: int) -> str:
    """Each program loops over rows ``pid * XBLOCK, pid * XBLOCK + programs * XBLOCK, ...`` (static
    bounds: the interpreter cannot range() over run-time ints)."""
    lines = src.split("\n")
    i = next(j for j, l in enumerate(lines) if l.strip().startswith("xoffset = tl.program_id(0)"))
    head = (f"    for xstart in range(0, {-(-xnumel // (programs * xblock))}):\n"
            f"        xoffset = (xstart * {programs} + tl.program_id(0)) * XBLOCK")
    body = [re.sub(r"xmask = tl\.full\(.*", "xmask = xindex < xnumel  # (the last pass runs past the rows)", l)
            for l in lines[i + 1:]]
    return "\n".join(lines[:i] + [head] + ["    " + l if l.strip() else l for l in body])


def load_module(name: str, ek, source: str):
    d = tempfile.mkdtemp(prefix="ln_gelu_sweep_")
    path = os.path.join(d, f"{name}.py")
    with open(path, "w") as f:
        f.write(backend.kernel_module(name, type(ek)(**{**ek.__dict__, "source": source})))
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return getattr(m, name)


def direct_launcher(ek, source, inputs, out, programs=None, num_warps=None, num_stages=None):
    """Launch ember's kernel (or a variant of its source) with the tensors its args name: argN is
    the Nth input, any other buffer is the output. None when the kernel reads something else."""
    ptrs = []
    for a in ek.args:
        m = re.fullmatch(r"arg(\d+)", a)
        ptrs.append(inputs[int(m.group(1))] if m else out)
    if sum(p is out for p in ptrs) != 1:
        return None
    kern = load_module(f"k_{abs(hash(source)) % 10**8}", ek, source)
    c = ek.config
    grid = (programs or -(-int(ek.xnumel) // c.XBLOCK),)
    names = kern.arg_names
    extra = {} if num_stages is None else {"num_stages": num_stages}
    if "rnumel" in names:
        extra["rnumel"] = int(ek.rnumel)

    def run():
        kern[grid](*ptrs, int(ek.xnumel), **extra, XBLOCK=c.XBLOCK, RBLOCK=c.RBLOCK, num_warps=num_warps or c.num_warps)
    return run


# ---- section 1: layer_norm + GELU ------------------------------------------------------------------
def ln_gelu_fn(d):
    def f(x, w, b):
        return F.gelu(F.layer_norm(x, (d,), w, b))
    return f


def ln_inputs(r, d):
    g = torch.Generator(device=DEV).manual_seed(0)
    return [torch.randn(r, d, generator=g, device=DEV).to(torch.bfloat16),
            torch.randn(d, generator=g, device=DEV).to(torch.bfloat16),
            torch.randn(d, generator=g, device=DEV).to(torch.bfloat16)]


def ln_section(res, r, d, configs, full: bool, deadline=None):
    try:
        return _ln_section(res, r, d, configs, full, deadline)
    finally:
        LN_FORCE.clear()  # (the other sections compile with ember's own choices)


def _ln_section(res, r, d, configs, full: bool, deadline=None):
    fn = ln_gelu_fn(d)
    x, w, b = inputs = ln_inputs(r, d)
    want = fn(*inputs)
    nbytes = 2 * x.numel() * 2
    y = torch.empty_like(x)
    gbs = lambda ms: nbytes / ms / 1e6  # noqa: E731
    rec = {"shape": [r, d], "bytes": nbytes, "variants": []}
    res["ln_gelu"].append(rec)
    LN_FORCE.clear(); LN_SEEN.clear()
    ef = ember_fn(fn)
    rec["err_ember"] = max_err(ef(*inputs), want)
    rec["ember_cfg"] = LN_SEEN.get("cfg")
    ek = LN_SEEN.get("ek")
    rec["ember_kernel_kind"] = ek.kind if ek is not None else None
    tf = torch.compile(fn) if not SMOKE else fn
    rec["err_torch"] = max_err(tf(*inputs), want)
    base = interleaved({"copy": lambda: y.copy_(x), "ember": lambda: ef(*inputs), "torch": lambda: tf(*inputs),
                        "eager": lambda: fn(*inputs)})
    copy_ms = base["copy"][0]
    rec.update({f"{k}_ms": v[0] for k, v in base.items()}, spread_ms={k: v[1] for k, v in base.items()})
    rec["copy_GBps"] = gbs(copy_ms)
    pct = lambda ms: 100 * copy_ms / ms  # noqa: E731
    peak = res.get("peaks", {}).get("copy_GBps")
    ppk = lambda ms: 100 * gbs(ms) / peak if peak else float("nan")  # noqa: E731
    print(f"\nln_gelu {r}x{d} bf16: ember picks XBLOCK, RBLOCK, warps = {rec['ember_cfg']} "
          f"(kernel kind {rec['ember_kernel_kind']})")
    if not SMOKE:
        for k in ("copy", "eager", "torch", "ember"):
            ms = base[k][0]
            print(f"  {k:34s} {ms * 1e3:7.1f} us  {gbs(ms):6.0f} GB/s  {ppk(ms):5.1f}% of peak  {pct(ms):5.1f}% of copy  "
                  f"[{base[k][1][0] * 1e3:.1f}, {base[k][1][1] * 1e3:.1f}]")

    def variant(tag, ms_fn, err, **meta):
        v = {"tag": tag, "err": err, **meta}
        if ms_fn is not None:
            v["ms"] = gpu_ms(ms_fn)
            if not SMOKE:
                v["GBps"], v["pct_copy"], v["pct_peak"] = gbs(v["ms"]), pct(v["ms"]), ppk(v["ms"])
        rec["variants"].append(v)
        line = f"  {tag:34s} " + (f"{v['ms'] * 1e3:7.1f} us  {v['GBps']:6.0f} GB/s  {v['pct_peak']:5.1f}% of peak  "
                                  f"{v['pct_copy']:5.1f}% of copy"
                                  if "GBps" in v else "") + f"  err {err:.3g}"
        print(line, flush=True)

    # forced configs of the generated kernel, compiled by ember (its wrapper and launcher)
    for cfg in configs:
        if not full and rec["ember_cfg"] and cfg == (rec["ember_cfg"][0], rec["ember_cfg"][2]):
            continue  # (ember's own: the "ember" row above)
        if deadline and time.time() > deadline:
            print("  (budget reached)")
            return rec
        LN_FORCE.clear(); LN_FORCE["cfg"] = cfg
        try:
            e2 = ember_fn(fn)
            err = max_err(e2(*inputs), want)
        except Exception as ex:  # a config Triton cannot compile: noted
            rec["variants"].append({"tag": f"XBLOCK={cfg[0]} warps={cfg[1]}", "error": repr(ex)[:300]})
            print(f"  XBLOCK={cfg[0]} warps={cfg[1]}: {ex!r}"[:200])
            continue
        variant(f"XBLOCK={cfg[0]} warps={cfg[1]}" + (" (ember's)" if LN_SEEN.get("default_cfg") and
                (cfg[0], cfg[1]) == (LN_SEEN["default_cfg"][0], LN_SEEN["default_cfg"][2]) else ""),
                lambda: e2(*inputs), err, cfg=list(cfg))
    if not full:
        return rec
    # source variants at ember's config and at 8 warps
    ember_cfg = (rec["ember_cfg"][0], rec["ember_cfg"][2]) if rec["ember_cfg"] else None
    for cfg in dict.fromkeys([ember_cfg, (1, 8)]):
        first = tuple(HINTS) if os.environ.get("LN_HINTS_ALL") else ("evict", "store_cs", "evict+store_cs")
        for sv in first + ("no_erf",) if cfg == ember_cfg else ("evict", "evict+store_cs", "no_erf"):
            LN_FORCE.clear(); LN_FORCE["src"] = sv
            if cfg:
                LN_FORCE["cfg"] = cfg
            try:
                e2 = ember_fn(fn)
                err = max_err(e2(*inputs), want)
            except Exception as ex:
                rec["variants"].append({"tag": f"{sv} {cfg}", "error": repr(ex)[:300]})
                print(f"  {sv} {cfg}: {ex!r}"[:200])
                continue
            src = LN_SEEN["ek"].source if LN_SEEN.get("ek") is not None else ""
            hints = src.count("eviction_policy=") + src.count("cache_modifier=")
            variant(f"{sv} XB={cfg[0]} w={cfg[1]}" + (f" ({hints} hints)" if sv in HINTS else ""),
                    lambda: e2(*inputs), err, cfg=list(cfg), src=sv, hints=hints)
    # ember's kernel launched directly (no wrapper): as emitted, then as a grid-stride loop
    if ek is None or ek.kind != "per":
        return rec
    sms = torch.cuda.get_device_properties(0).multi_processor_count if not SMOKE else 2
    out = torch.empty_like(want)
    run = direct_launcher(ek, ek.source, inputs, out)
    if run is None:
        print("  (ember's kernel reads more than x, w, b: direct launches skipped)")
        return rec
    run()
    variant("direct, as emitted", run, max_err(out, want), cfg=[ek.config.XBLOCK, ek.config.num_warps])
    for per_sm, warps, stages in GRID_STRIDE:
        out.zero_()
        tag = f"grid-stride {per_sm}/SM w={warps}" + (f" st={stages}" if stages else "")
        try:
            gsrc = grid_stride_source(ek.source, int(ek.xnumel), sms * per_sm, ek.config.XBLOCK)
            run = direct_launcher(ek, gsrc, inputs, out, programs=sms * per_sm, num_warps=warps, num_stages=stages)
            run()
        except Exception as ex:
            print(f"  {tag}: {ex!r}"[:200])
            continue
        variant(tag, run, max_err(out, want), programs=sms * per_sm, cfg=[ek.config.XBLOCK, warps], stages=stages)
    return rec


# ---- section 2: BatchNorm statistics at 256 x 56 x 56 ----------------------------------------------
BN_VARIANTS = [  # (chunk rows or None = today's rule, (XBLOCK, RBLOCK, warps) or None = today's, eviction hints)
    (None, None, False), (None, None, True), (None, (32, 64, 4), False), (None, (32, 64, 4), True),
    (2048, (32, 64, 4), False), (2048, (32, 64, 4), True), (1024, (64, 32, 4), True),
]


# the other ResNet shapes whose chunks today's rule makes as long (64x112x112: 896 rows) or shorter
# (512x28x28: 448): does a new tile there help or hurt?
BN_OTHER = [(None, None, False), (None, (32, 64, 4), False), (None, (32, 64, 4), True)]
BN_CASES = [((256, 56, 56), BN_VARIANTS), ((64, 112, 112), BN_OTHER), ((512, 28, 28), BN_OTHER)]


def bn_section(res):
    res["bn_stats"] = []
    for (c, h, w), variants in BN_CASES if not SMOKE else [((32, 6, 6), BN_VARIANTS)]:
        bn_case(res, 4 if SMOKE else 64, c, h, w, variants, peer=variants is BN_VARIANTS)


def bn_case(res, n, c, h, w, variants, peer=True):
    if SMOKE:
        orr.SMOKE_OPTS.update(split_reduction_programs=16, split_reduction_numel=64, single_program_numel=64,
                              split_outer_rows=9)
    args, want = orr.inputs("fwd_stats", n, c, h, w, DEV)
    fn = orr.fwd_stats
    nbytes = orr.ideal_bytes("fwd_stats", n, c, h, w)
    src = args[0]; dst = torch.empty_like(src)
    rec = {"shape": [n, c, h, w], "bytes": nbytes, "variants": []}
    res["bn_stats"].append(rec)
    runs = {"copy": lambda: dst.copy_(src), "eager": lambda: fn(*args)}
    if not SMOKE and peer:  # (torch.compile at the other shapes: benchmarks/results/outer_reduction-fwd-nvidia-h100-s37.json)
        tf = torch.compile(fn)
        rec["err_torch"] = orr.close(tf(*args), want, "fwd_stats")
        runs["torch"] = lambda: tf(*args)
    for chunk, cfg, evict in variants:
        if SMOKE and chunk:
            chunk = 48
        orr.FORCE.clear(); orr.SEEN.clear()
        if chunk:
            orr.FORCE["chunk"] = chunk
        if cfg:
            orr.FORCE["cfg"] = cfg if not SMOKE else (16, 16, 2)
        te.EVICTION = orr.EVICT if evict else {}
        try:
            ef = ember_fn(fn)
            err = orr.close(ef(*args), want, "fwd_stats")
        finally:
            te.EVICTION = {}
        tag = f"ember chunk={chunk or 'rule'} cfg={cfg or 'table'} evict={int(evict)}"
        # timed now: the next variant's ember.reset() makes this function compile again (unforced)
        t = interleaved({tag: lambda: ef(*args)})[tag]
        rec["variants"].append({"tag": tag, "chunk": chunk, "cfg": cfg, "evict": evict, "err": err,
                                "S": orr.SEEN.get("S"), "seen": orr.SEEN.get("cfg"), "ms": t[0], "spread_ms": t[1]})
    orr.FORCE.clear()
    got = interleaved(runs)
    got.update({v["tag"]: (v["ms"], v["spread_ms"]) for v in rec["variants"]})
    copy_ms = got["copy"][0]
    print(f"\nbn_stats var_mean(x.float(), (0,2,3)) {n}x{c}x{h}x{w} bf16 channels-last "
          f"(ideal bytes {nbytes / 1e6:.0f} MB; % of a copy of x)")
    for k, (ms, spread) in got.items():
        v = next((v for v in rec["variants"] if v["tag"] == k), None)
        extra = f"  S={v['S']} cfg seen={v['seen']} err={v['err']:.1e}" if v else ""
        if not v:
            rec[f"{k}_ms"], rec.setdefault("spread_ms", {})[k] = ms, spread
        if not SMOKE:
            print(f"  {k:48s} {ms * 1e3:6.1f} us  {100 * copy_ms / ms * nbytes / (2 * src.numel() * 2):5.1f}%  "
                  f"[{spread[0] * 1e3:.1f}, {spread[1] * 1e3:.1f}]{extra}")
        else:
            print(f"  {k:48s}{extra}")


# ---- section 3: max_pool2d backward at ResNet-50's stem ----------------------------------------------
def maxpool_bwd(g, x, idx):
    return aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)


def cuda_kernels(fn) -> list:
    if SMOKE:
        return []
    fn(); torch.cuda.synchronize()
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            fn(); torch.cuda.synchronize()
        return sorted({e.key for e in p.key_averages() if "CUDA" in str(e.device_type)})
    except Exception as ex:  # noqa: BLE001 - the list is informative only
        return [f"(profiler failed: {ex!r})"]


def maxpool_section(res):
    n, c, h, w = (2, 8, 12, 12) if SMOKE else (64, 64, 112, 112)
    gen = torch.Generator(device=DEV).manual_seed(0)
    # (rounded to bf16 before the pool: ties between overlapping windows happen, as after a ReLU)
    x = torch.randn(n, h, w, c, generator=gen, device=DEV).relu().to(torch.bfloat16).permute(0, 3, 1, 2)
    y, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    g = torch.randn(y.shape, generator=gen, device=DEV).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    want = maxpool_bwd(g, x, idx)
    ef = ember_fn(maxpool_bwd)
    got = ef(g, x, idx)
    rec = {"shape": [n, c, h, w], "equal_ember": bool(torch.equal(got, want)), "err_ember": max_err(got, want),
           "ember_strides": list(got.stride()), "eager_strides": list(want.stride())}
    runs = {"eager": lambda: maxpool_bwd(g, x, idx), "ember": lambda: ef(g, x, idx)}
    if not SMOKE:
        tf = torch.compile(maxpool_bwd)
        tg = tf(g, x, idx)
        rec["equal_torch"], rec["err_torch"] = bool(torch.equal(tg, want)), max_err(tg, want)
        runs["torch"] = lambda: tf(g, x, idx)
    rec["ember_kernels"] = cuda_kernels(runs["ember"])
    got_t = interleaved(runs)
    rec.update({f"{k}_ms": v[0] for k, v in got_t.items()}, spread_ms={k: v[1] for k, v in got_t.items()})
    res["maxpool_bwd"] = rec
    nbytes = (g.numel() * (2 + 8)) + x.numel() * 2  # grad_out + int64 indices read, grad_in written
    print(f"\nmaxpool_bwd {n}x{c}x{h}x{w} bf16 channels-last, 3x3/2 pad 1: ember == eager: {rec['equal_ember']} "
          f"(max err {rec['err_ember']:.3g}; strides {rec['ember_strides']} vs eager {rec['eager_strides']})")
    print(f"  ember's CUDA kernels: {rec['ember_kernels']}")
    if not SMOKE:
        for k, (ms, spread) in got_t.items():
            print(f"  {k:8s} {ms * 1e3:7.1f} us  {nbytes / ms / 1e6:6.0f} GB/s  [{spread[0] * 1e3:.1f}, {spread[1] * 1e3:.1f}]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget", type=float, default=100.0)
    ap.add_argument("--only", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    warnings.filterwarnings("error", message="ember")  # a graph run eagerly must not pass as a measurement
    ember.config.cache_dir = tempfile.mkdtemp(prefix="ln_gelu_sweep_")
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name() if not SMOKE else "cpu-interpreter", "torch": torch.__version__,
           "ln_gelu": []}
    want = lambda s: not a.only or s in a.only.split(",")  # noqa: E731
    if not SMOKE:
        from _gpu_metrics import device_peaks
        res["peaks"] = device_peaks("cuda")
        print(f"device {res['device']}: copy peak {res['peaks']['copy_GBps']:.0f} GB/s (1 GiB y.copy_(x))")
    def section(name, fn):
        """One section; an error is printed and recorded, and the others still run."""
        try:
            fn()
        except Exception as ex:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            res.setdefault("errors", {})[name] = repr(ex)[:500]
            print(f"section {name} failed: {ex!r}"[:300], flush=True)
        finally:
            LN_FORCE.clear(); orr.FORCE.clear(); te.EVICTION = {}
            if a.out:  # (what is measured so far, in case a later section hangs)
                with open(a.out, "w") as f:
                    json.dump(res, f, indent=1, default=str)

    def main_row():
        r, d = (200, 256) if SMOKE else (8192, 4096)
        rec = ln_section(res, r, d, LN_CONFIGS if not SMOKE else [(1, 2), (2, 4)], full=True)
        if not SMOKE:
            best = max((v for v in rec["variants"] if "pct_peak" in v and v.get("src") != "no_erf"),
                       key=lambda v: v["pct_peak"], default=None)
            if best:
                print(f"  best candidate: {best['tag']} {best['pct_peak']:.1f}% of the copy peak, "
                      f"{best['pct_copy']:.1f}% of this copy")

    def widths():  # the other widths, as the budget allows
        deadline = t0 + a.budget if not SMOKE else None
        for r, d in (WIDTHS if not SMOKE else [(16, 96)]):
            if deadline and time.time() > deadline:
                print(f"budget reached: widths from {d} on skipped")
                break
            ln_section(res, r, d, LN_WIDTH_CONFIGS if not SMOKE else [(2, 4)], full=False, deadline=deadline)

    for name, fn in (("ln_gelu", main_row), ("bn_stats", lambda: bn_section(res)),
                     ("maxpool_bwd", lambda: maxpool_section(res)), ("widths", widths)):
        if want(name):
            section(name, fn)
    print(f"\n{time.time() - t0:.0f}s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
        print("wrote", a.out)


if __name__ == "__main__":
    main()
