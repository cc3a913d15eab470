"""Probe (H100): BatchNorm-style "outer" reductions of channels-last bf16 tensors (issue 28).

The reduced dim (N*H*W) is strided, the kept dim (channels) contiguous. Three functions per ResNet-50
shape [64, C, H, W]:
  fwd_stats  var_mean over (0, 2, 3) of x.float()                       (BN forward statistics)
  bwd        where(y <= 0, 0, g): sum and sum * (x - mean)              (BN + ReLU backward sums)
  bwd_res    kernel-51-like: two ReLU masks, a residual add, the bf16 grad written, two sums
Each is timed (CUDA events) eagerly, under torch.compile and under ember's current heuristic (and
session 35's, "old": few long chunks, 16x256 tiles); then
ember is swept over the split reduction's chunk size (rows per chunk of the partial kernel) and the
partial kernel's launch config (XBLOCK, RBLOCK, num_warps), by patching split_reduction.split_count
and triton_emit.choose_config in this process (graph cache off, so each variant compiles afresh).
GB/s counts the bytes the function must move (each input read once, each output written once); %cp
is that as a share of a bf16 copy's GB/s on the same tensor.

fwd_stats is timed twice under ember: as compiled (var_mean's sums in one Welford pass, split as one
pair: triton_welford, split_reduction.split_pair) and with the pairs switched off ("two-pass": the
mean, then the squared deviations, each split on its own: x read twice, session 36's kernels); the
table at the end puts both beside eager and torch.compile per shape.

usage (H100, ~3-4 min):  python benchmarks/probes/outer_reduction.py --out /tmp/outer.json
  var_mean forward only (~1 min):  ... --only fwd_stats --budget 0
  --budget S    stop the sweep after S seconds (default 210), printing what was measured
  --only NAME   functions/shapes whose name contains NAME (e.g. --only bwd_res, --only 256x56)
  --smoke       CPU check (Triton interpreter, tiny shapes): every variant matches eager; no timing
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
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
import ember.native.triton_welford as tw  # noqa: E402

SHAPES = [(64, 112, 112), (256, 56, 56), (512, 28, 28), (1024, 14, 14), (2048, 7, 7)]
SMOKE_SHAPES = [(16, 6, 6), (32, 3, 3)]  # N=4 in the smoke run: 144 and 36 rows
CHUNKS = [256, 512, 1024, 2048, 4096]     # rows per chunk of the partial kernel
CONFIGS = [(16, 256, 8), (32, 64, 4), (32, 32, 4), (64, 32, 4), (64, 16, 4), (128, 16, 8), (64, 64, 8)]
SMOKE_CHUNKS, SMOKE_CONFIGS = [16, 48], [(16, 16, 4), (32, 8, 2), (16, 32, 2)]
EVICT = {"stream": "evict_first", "reused": "evict_last"}  # triton_emit.EVICTION of the variants that hint


# ---- the functions ---------------------------------------------------------------------------------
def fwd_stats(x):
    return torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)


def bwd(g, y, x, mean):
    gz = torch.where(y <= 0, 0, g).float()
    return gz.sum((0, 2, 3)), (gz * (x.float() - mean[None, :, None, None])).sum((0, 2, 3))


def bwd_res(a, b, c, y1, y2, x, mean):
    gz = torch.where(y1 <= 0, 0, torch.where(y2 <= 0, 0, a + b) + c)
    f = gz.float()
    return gz, f.sum((0, 2, 3)), (f * (x.float() - mean[None, :, None, None])).sum((0, 2, 3))


FUNCS = {  # name -> (fn, number of [N,C,H,W] bf16 inputs, [N,C,H,W] outputs written)
    "fwd_stats": (fwd_stats, 1, 0),
    "bwd": (bwd, 3, 0),
    "bwd_res": (bwd_res, 6, 1),
}


_INPUTS: dict = {}


def inputs(name, n, c, h, w, device):
    """The case's arguments and eager result, made once per case (on the device: fast)."""
    key = (name, n, c, h, w)
    if key not in _INPUTS:
        gen = torch.Generator(device=device).manual_seed(0)
        _, nbig, _ = FUNCS[name]

        def big():
            t = torch.randn(n, h, w, c, generator=gen, device=device).to(torch.bfloat16)
            return t.permute(0, 3, 1, 2)  # [n, c, h, w], channels-last strides
        args = [big() for _ in range(nbig)]
        if name != "fwd_stats":
            args.append(torch.randn(c, generator=gen, device=device) * 0.1)
        _INPUTS[key] = (args, FUNCS[name][0](*args))
    return _INPUTS[key]


def ideal_bytes(name, n, c, h, w):
    _, nbig, nout = FUNCS[name]
    return (nbig + nout) * n * c * h * w * 2


# ---- forcing ember's choices ------------------------------------------------------------------------
SMOKE_OPTS: dict = {}  # --smoke: split tiny shapes too (the thresholds of tests/native/test_split_reduction.py)
FORCE: dict = {}  # "chunk": rows per chunk; "cfg": (XBLOCK, RBLOCK, num_warps); "twopass": no Welford pairs
SEEN: dict = {}   # what the compile chose: "S" (split count), "cfg" (partial kernel's config), "welford"
_split_count, _choose_config = sr.split_count, te.choose_config
_graph_pairs, _welford_pairs = sr.graph_pairs, tw.pairs


def graph_pairs(nodes):
    return {} if FORCE.get("twopass") else _graph_pairs(nodes)


def welford_pairs(em):
    pairs = {} if FORCE.get("twopass") else _welford_pairs(em)
    if pairs:  # (kernels with a one-pass var_mean)
        SEEN["welford"] = SEEN.get("welford", 0) + 1
    return pairs


def split_count(n, ranges, reduced, body, options, *more, **kw):
    if SMOKE_OPTS:
        options = dataclasses.replace(options, **SMOKE_OPTS)
    if FORCE.get("old"):  # session 35's rule: few long chunks (the C++ renderer's)
        more, kw = (), {}
    s = _split_count(n, ranges, reduced, body, options, *more, **kw)
    vs = sr.ir.node_vars(len(ranges))
    strided = not sr.contiguous_reduction(body, vs[reduced[-1]], dict(zip(vs, ranges)))
    if strided and "chunk" in FORCE and n.reduction_type in sr.SPLITTABLE:
        size = ranges[reduced[0]]
        s = max(1, min(-(-size // FORCE["chunk"]), size // 2))
    if strided:
        SEEN.setdefault("S", []).append(s)
    return s


def choose_config(k, options, inner, persistent_ok=True, **kw):
    cfg = _choose_config(k, options, inner, persistent_ok, **kw)
    final = any(str(b).endswith("_partial") for b in k.reads)  # reduces the partials: left alone
    if k.is_reduction and not inner and not final:
        if FORCE.get("old") and not cfg.persistent:  # session 35's config of looped strided reductions
            xb = min(64, max(16, te.next_pow2(-(-k.xnumel // 512))), te.next_pow2(k.xnumel))
            rb = min(te.next_pow2(k.rnumel), 4096 // xb)
            cfg = te.LaunchConfig(xb, rb, 8 if xb * rb >= 2048 else 4, False)
        if "cfg" in FORCE:
            xb, rb, w = FORCE["cfg"]
            cfg = te.LaunchConfig(min(xb, te.next_pow2(k.xnumel)), min(rb, te.next_pow2(k.rnumel)), w, False)
        SEEN.setdefault("cfg", []).append((cfg.XBLOCK, cfg.RBLOCK, cfg.num_warps, cfg.persistent,
                                           int(k.xnumel), int(k.rnumel)))
    return cfg


sr.split_count, te.choose_config = split_count, choose_config
sr.graph_pairs, tw.pairs = graph_pairs, welford_pairs


# ---- timing -----------------------------------------------------------------------------------------
def loop_ms(fn, reps=3, n=None):
    fn()
    torch.cuda.synchronize()
    if n is None:  # ~20 ms of work per sample
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); e.synchronize()
        n = max(5, min(400, int(20 / max(s.elapsed_time(e), 1e-3))))
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(n):
            fn()
        e.record(); e.synchronize()
        out.append(s.elapsed_time(e) / n)
    return statistics.median(out)


TIMING = {"graph": 0, "loop": 0}


def cuda_ms(fn):
    """GPU time of one call: replayed from a CUDA graph of 10 calls (no CPU launch cost in it, which
    would hide the small shapes' kernels); timed call by call when capture fails."""
    try:
        fn(); fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(10):
                fn()
        ms = loop_ms(g.replay) / 10
        TIMING["graph"] += 1
        return ms
    except Exception:
        torch.cuda.synchronize()
        TIMING["loop"] += 1
        return loop_ms(fn)


def close(got, want, name):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    worst = 0.0
    for g_, w_ in zip(got, want, strict=True):
        g_, w_ = g_.float(), w_.float()
        scale = w_.abs().max().item() + 1e-6
        worst = max(worst, (g_ - w_).abs().max().item() / scale)
    return worst


def ember_fn(fn):
    ember.reset()
    ember.config.cache_dir = tempfile.mkdtemp(prefix="outer_red_")  # (no entry of another variant)
    return ember.compile(fn, options={"force_disable_caches": True})  # (NativeOptions.cache=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget", type=float, default=210.0)
    ap.add_argument("--only", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    smoke = a.smoke
    device = "cpu" if smoke else "cuda"
    warnings.filterwarnings("error", message="ember")  # a graph run eagerly must not pass as a measurement
    ember.config.cache_dir = tempfile.mkdtemp(prefix="outer_red_")
    batch = 4 if smoke else 64
    shapes, chunks, configs = (SMOKE_SHAPES, SMOKE_CHUNKS, SMOKE_CONFIGS) if smoke else (SHAPES, CHUNKS, CONFIGS)
    if smoke:
        SMOKE_OPTS.update(split_reduction_programs=16, split_reduction_numel=64, single_program_numel=64,
                          split_outer_rows=9)
    t0 = time.time()
    rows, results = [], {"device": torch.cuda.get_device_name() if not smoke else "cpu-interpreter",
                         "torch": torch.__version__, "batch": batch, "records": []}

    def record(**r):
        results["records"].append(r)
        return r

    cases = [(f, s) for s in shapes for f in FUNCS if not a.only or a.only in f"{f} {s[0]}x{s[1]}"]
    copy_gbs = {}
    # phase 1: eager, torch.compile, ember's heuristic, for every case
    for name, (c, h, w) in cases:
        fn = FUNCS[name][0]
        args, want = inputs(name, batch, c, h, w, device)
        assert args[0].is_contiguous(memory_format=torch.channels_last)
        nbytes = ideal_bytes(name, batch, c, h, w)
        tag = f"{c}x{h}x{w}"
        if not smoke and tag not in copy_gbs:
            src = args[0]; dst = torch.empty_like(src)
            copy_gbs[tag] = 2 * src.numel() * 2 / cuda_ms(lambda: dst.copy_(src)) / 1e6
        FORCE.clear(); SEEN.clear()
        ef = ember_fn(fn)
        err = close(ef(*args), want, name)
        seen = dict(SEEN)
        entry = {"fn": name, "shape": [batch, c, h, w], "bytes": nbytes, "err_ember": err, "S": seen.get("S"),
                 "cfg": seen.get("cfg"), "welford_kernels": seen.get("welford", 0)}
        ef2 = None
        if name == "fwd_stats":  # the same, var_mean in two passes (the pairs off)
            FORCE["twopass"] = True
            ef2 = ember_fn(fn)
            entry["err_ember_twopass"] = close(ef2(*args), want, name)
            FORCE.clear()
        if not smoke:
            entry["eager_ms"] = cuda_ms(lambda: fn(*args))
            tf = torch.compile(fn)
            entry["err_torch"] = close(tf(*args), want, name)
            entry["torch_ms"] = cuda_ms(lambda: tf(*args))
            entry["ember_ms"] = cuda_ms(lambda: ef(*args))
            if ef2 is not None:  # three interleaved rounds of ember, two-pass, torch.compile: medians
                runs = {"ember_ms": lambda: ef(*args), "ember_twopass_ms": lambda: ef2(*args),
                        "torch_ms": lambda: tf(*args)}
                got = {key: [] for key in runs}
                for _ in range(3):
                    for key, f in runs.items():
                        got[key].append(cuda_ms(f))
                entry.update({key: statistics.median(v) for key, v in got.items()})
                entry["spread_ms"] = {key: [min(v), max(v)] for key, v in got.items()}
            entry["copy_gbs"] = copy_gbs[tag]
            torch._dynamo.reset()
        record(kind="base", **entry)
        rows.append(entry)
        print(f"[{time.time() - t0:5.0f}s] {name:9s} {tag:12s} " + (
            f"eager {entry['eager_ms']:.3f}  torch {entry['torch_ms']:.3f}  ember {entry['ember_ms']:.3f} ms "
            f"({nbytes / entry['ember_ms'] / 1e6 / copy_gbs[tag] * 100:.0f}% cp; torch "
            f"{nbytes / entry['torch_ms'] / 1e6 / copy_gbs[tag] * 100:.0f}%)" if not smoke else "")
              + (f" two-pass {entry['ember_twopass_ms']:.3f}" if "ember_twopass_ms" in entry else "")
              + f"  S={seen.get('S')} cfg={seen.get('cfg')} welford={entry['welford_kernels']} err={err:.1e}"
              + (f" (two-pass {entry['err_ember_twopass']:.1e})" if ef2 is not None else ""), flush=True)
    # phase 2: the sweep, cases interleaved so a budget cut leaves every case partly covered. Order:
    # eviction hints on/off at a reference point and on under the heuristic; chunk sizes at the
    # reference config; configs at the reference chunk size; then the rest of the grid, shuffled
    ref_cfg, ref_chunk = configs[2], chunks[1]
    plan = [dict(chunk=None, cfg=None, evict=False, old=True),
            dict(chunk=ref_chunk, cfg=ref_cfg, evict=True), dict(chunk=ref_chunk, cfg=ref_cfg, evict=False),
            dict(chunk=None, cfg=None, evict=True)]
    plan += [dict(chunk=ch, cfg=ref_cfg, evict=True) for ch in chunks if ch != ref_chunk]
    plan += [dict(chunk=ref_chunk, cfg=cf, evict=True) for cf in configs if cf != ref_cfg]
    rest = [dict(chunk=ch, cfg=cf, evict=True) for ch in chunks for cf in configs if ch != ref_chunk and cf != ref_cfg]
    plan += [rest[j] for j in random.Random(0).sample(range(len(rest)), len(rest))]
    best = {}
    stopped = False
    for i, v in enumerate(plan):
        for name, (c, h, w) in cases:
            if name == "bwd" and not smoke:
                continue  # bwd_res covers it (the same reduction, more streams)
            if not smoke and time.time() - t0 > a.budget:
                stopped = True
                break
            rnum = batch * h * w
            if v["chunk"] and v["chunk"] * 2 > rnum:
                continue
            fn = FUNCS[name][0]
            args, want = inputs(name, batch, c, h, w, device)
            FORCE.clear(); SEEN.clear()
            FORCE.update({key: val for key, val in v.items() if val is not None and key != "evict"})
            v.setdefault("old", False)
            te.EVICTION = EVICT if v["evict"] else {}
            tag = f"{name} {c}x{h}x{w} chunk={v['chunk']} cfg={v['cfg']} evict={v['evict']}" + (" OLD" if v["old"] else "")
            try:
                ef = ember_fn(fn)
                err = close(ef(*args), want, name)
            except Exception as ex:  # a config Triton cannot compile (registers, shared memory): noted
                record(kind="sweep", fn=name, shape=[batch, c, h, w], **v, error=repr(ex)[:300])
                print(f"  {tag}: {ex!r}"[:240], flush=True)
                continue
            finally:
                te.EVICTION = {}
            r = record(kind="sweep", fn=name, shape=[batch, c, h, w], **v, S=SEEN.get("S"), seen=SEEN.get("cfg"),
                       err=err)
            if smoke:
                print(f"  {tag} S={SEEN.get('S')} err={err:.1e}", flush=True)
                continue
            r["ms"] = cuda_ms(lambda: ef(*args))
            print(f"  [{time.time() - t0:4.0f}s] {tag} S={(SEEN.get('S') or ['?'])[0]}: {r['ms']:.4f} ms", flush=True)
            best.setdefault((name, (c, h, w)), []).append(r)
        if stopped:
            print(f"budget reached after {i} of {len(plan)} sweep steps", flush=True)
            break
    if not smoke:
        print("\nms per call; %cp: bytes moved / time as a share of a bf16 copy's GB/s")
        print("fn        shape        eager  torch  ember  | %cp torch ember | best 3 (ms %cp chunk S cfg evict)")
        for e in rows:
            cp = e["copy_gbs"]
            pct = lambda ms: e["bytes"] / ms / 1e6 / cp * 100  # noqa: E731
            top = sorted(best.get((e["fn"], tuple(e["shape"][1:])), []), key=lambda r: r["ms"])[:3]
            tops = "; ".join(f"{r['ms']:.3f} {pct(r['ms']):.0f}% {r['chunk']} {(r['S'] or ['?'])[0]} "
                             f"{tuple(r['cfg']) if r['cfg'] else 'heur'} {'E' if r['evict'] else '-'}" for r in top)
            old = [r for r in best.get((e["fn"], tuple(e["shape"][1:])), []) if r.get("old")]
            tops = (f"old {old[0]['ms']:.3f} {pct(old[0]['ms']):.0f}% | " if old else "") + tops
            print(f"{e['fn']:9s} {'x'.join(map(str, e['shape'][1:])):12s} {e['eager_ms']:.3f}  {e['torch_ms']:.3f}  "
                  f"{e['ember_ms']:.3f}  | {pct(e['torch_ms']):3.0f} {pct(e['ember_ms']):3.0f} | {tops}")
        stats = [e for e in rows if e["fn"] == "fwd_stats" and "ember_twopass_ms" in e]
        if stats:
            print("\nvar_mean forward (BN statistics), ms per call; ember one-pass (Welford) vs two-pass:")
            print("shape        eager   torch   ember   2-pass  ember/torch  ember/2-pass")
            wins = 0
            for e in stats:
                wins += e["ember_ms"] <= e["torch_ms"]
                print(f"{'x'.join(map(str, e['shape'][1:])):12s} {e['eager_ms']:.4f}  {e['torch_ms']:.4f}  "
                      f"{e['ember_ms']:.4f}  {e['ember_twopass_ms']:.4f}  {e['ember_ms'] / e['torch_ms']:.2f}x"
                      f"        {e['ember_ms'] / e['ember_twopass_ms']:.2f}x")
            results["fwd_stats_wins"] = f"{wins}/{len(stats)}"
            print(f"ember <= torch.compile at {wins} of {len(stats)} shapes; sum over shapes: ember "
                  f"{sum(e['ember_ms'] for e in stats):.4f} ms, torch.compile {sum(e['torch_ms'] for e in stats):.4f} ms,"
                  f" two-pass {sum(e['ember_twopass_ms'] for e in stats):.4f} ms")
    bad = [r for r in results["records"]
           if max(r.get("err", 0) or 0, r.get("err_ember", 0) or 0, r.get("err_ember_twopass", 0) or 0) > 2e-2]
    results["timing"] = TIMING
    print(f"timings: {TIMING}")
    print(f"\n{len(results['records'])} records, {len(bad)} above 2e-2 relative error; {time.time() - t0:.0f}s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        print("wrote", a.out)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
