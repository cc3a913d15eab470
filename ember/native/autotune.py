"""Compile-time tuning for ``mode="max-autotune"``: time candidate launch configurations of every
generated kernel, and cuBLAS against a Triton matmul template, on the device; keep the fastest.

Kernels. The emitter's heuristic config (``triton_emit.choose_config``) is the first candidate;
the others are its neighbours, in the parameters that do not change the kernel's source: XBLOCK and
num_warps (pointwise, persistent reductions: RBLOCK must still cover the row), RBLOCK, num_warps and
num_stages (looped reductions). A candidate replaces the heuristic only when it is at least
``MIN_GAIN`` faster, so timing noise does not churn the choice. Single-program kernels are left alone.

Matmuls. ``mm``/``addmm``/``bmm`` extern calls are timed against ``ember_mm``: a tiled ``tl.dot``
kernel whose epilogue applies ``alpha``/``beta`` and the bias (addmm) and has an activation hook
(``ACTIVATION``: "", "relu", "gelu"). A template config wins only if it is faster and its result
matches cuBLAS; the wrapper then calls an ``MMTemplate`` instead of the ATen op.

Every decision is cached on disk (``<cache>/native/autotune/``) under a hash of the kernel source,
sizes, dtypes, device name and library versions. Timing needs a GPU: under the Triton interpreter,
or on CPU tensors, ``tune`` returns at once and the heuristic configs stay (no error).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import torch
import triton

from ember import diskcache
from ember.native import cache
from ember.native.mm_kernel import ember_mm  # (a module of its own: the build workers import it)
from ember.config import environment
from ember.native.options import NativeOptions

MIN_GAIN = 0.03           # a candidate must be this much faster than the current choice
VERSION = "1"             # bump when candidates or the template change: old cache entries are ignored
_WARMUP_MS, _REP_MS = 5, 25


def skip_reason(device) -> str | None:
    if environment.triton_interpret:
        return "the Triton interpreter cannot time kernels"
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "no CUDA device to time kernels on"
    return None


# ------------------------------------------------------------------------------------------ progress

class Progress:
    """One line on stderr, redrawn in place: ``[ember max-autotune] ####---- 12/40 (5 cached)``."""

    def __init__(self, total: int, what: str):
        self.total, self.what, self.done, self.cached = total, what, 0, 0
        self.t0 = time.perf_counter()
        self.live = total > 0
        self._draw()

    def step(self, cached: bool = False):
        self.done += 1
        self.cached += cached
        self._draw()

    def _draw(self):
        if not self.live:
            return
        width = 24
        fill = width * self.done // max(1, self.total)
        bar = "#" * fill + "-" * (width - fill)
        sys.stderr.write(f"\r[ember max-autotune] {bar} {self.done}/{self.total} {self.what} "
                         f"({self.cached} cached, {time.perf_counter() - self.t0:.1f}s)")
        if self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


# --------------------------------------------------------------------------------------------- timing

def bench_ms(fn) -> float:
    """Median time of ``fn`` in ms (CUDA events, L2 flushed between runs by Triton's do_bench)."""
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=_WARMUP_MS, rep=_REP_MS, return_mode="median"))


def _key(*parts) -> str:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return cache.sha("|".join(map(str, (VERSION, name, torch.__version__, triton.__version__) + parts)))


_KIND = "native-autotune"


def _load(key: str, base):
    """A timing result, through ``ember.diskcache``'s envelope (its key and checksum checked)."""
    top = cache.root(base)
    path = os.path.join(top, "autotune", key[:2], f"{key}.json")
    if not diskcache.secure_dir(os.path.dirname(path), top, create=False):
        return None
    return diskcache.read_json(path, _KIND, key)


def _store(key: str, value, base) -> None:
    top = cache.root(base)
    diskcache.write_entry(os.path.join(top, "autotune", key[:2], f"{key}.json"), top, _KIND, key,
                          json.dumps(value).encode())


# -------------------------------------------------------------------------------------- kernel configs

def candidates(ek, single: bool, opts: NativeOptions) -> list:
    """Launch configs to time for one emitted kernel: the heuristic one first."""
    from ember.native.triton_emit import LaunchConfig, next_pow2
    base = ek.config
    if single:
        return [base]
    max_x, max_r = opts.max_xblock, opts.max_rblock
    out = [base]

    def add(xb, rb, warps, stages=None):
        if xb > max_x or (rb is not None and rb > max_r) or warps > 32 or warps < 1:
            return
        # the kernel's masks were left out for blocks that divide its sizes (triton_emit._mask)
        if (ek.exact_x and ek.xnumel % xb) or (ek.exact_r and rb is not None and ek.rnumel % rb):
            return
        c = LaunchConfig(xb, rb, warps, base.persistent, stages)
        if c not in out:
            out.append(c)

    xmax = next_pow2(ek.xnumel)
    if ek.kind == "poi":
        for xb in (512, 1024, 2048):
            if xb <= max(xmax, base.XBLOCK):
                for warps in (4, 8):
                    if 2 <= xb // (32 * warps) <= 16:  # elements per thread: vector loads, few registers
                        add(xb, None, warps)
    elif ek.kind == "per":
        rb = base.RBLOCK
        for xb in sorted({max(1, base.XBLOCK // 2), base.XBLOCK, base.XBLOCK * 2}):
            if xb <= xmax and xb * rb <= 16384:
                for warps in (base.num_warps // 2, base.num_warps, base.num_warps * 2):
                    if xb * rb // (32 * max(1, warps)) >= 1:
                        add(xb, rb, warps)
    else:  # looped reduction
        rmax = next_pow2(ek.rnumel)
        for rb in (base.RBLOCK // 2, base.RBLOCK, base.RBLOCK * 2):
            if 64 <= rb <= rmax:
                for warps in (base.num_warps // 2, base.num_warps, base.num_warps * 2):
                    add(base.XBLOCK, rb, warps)
        add(base.XBLOCK, base.RBLOCK, base.num_warps, 1)
    return out[:10]


def _fill(t: torch.Tensor) -> torch.Tensor:
    # integers may index other buffers: zeros are always in bounds
    return t.normal_() if t.is_floating_point() else t.zero_()


def _launch_site_buffers(ek, layouts, device):
    return [_fill(torch.empty(max(1, layouts[b].storage_numel), dtype=layouts[b].dtype, device=device))
            for b in ek.args]


def tune_kernel(fn, ek, single: bool, layouts, opts: NativeOptions, base_dir) -> tuple:
    """(best LaunchConfig, from cache?) for one launch site of ``fn`` (the loaded @triton.jit kernel)."""
    from ember.native.triton_emit import LaunchConfig
    sig = [(layouts[b].dtype, layouts[b].storage_numel) for b in ek.args]
    key = _key("kernel", ek.source, ek.kind, ek.xnumel, ek.rnumel, sig, single, sorted(opts_for_key(opts).items()))
    hit = _load(key, base_dir)
    if hit is not None:
        return LaunchConfig(**hit), True
    cands = candidates(ek, single, opts)
    best, best_ms = ek.config, None
    if len(cands) > 1:
        device = layouts[ek.args[0]].device if ek.args else "cuda"
        bufs = _launch_site_buffers(ek, layouts, device)
        for cfg in cands:
            ms = _time_config(fn, ek, cfg, single, bufs)
            if ms is not None and (best_ms is None or ms < best_ms * (1 - MIN_GAIN)):
                best, best_ms = cfg, ms
        del bufs
    _store(key, dataclasses.asdict(best), base_dir)
    return best, False


def launch_meta(ek, cfg, single: bool) -> tuple:
    """(grid, meta) of a launch with ``cfg``: what the wrapper's ``Launch`` receives."""
    grid = 1 if single else max(1, -(-ek.xnumel // cfg.XBLOCK))
    meta = {"XBLOCK": cfg.XBLOCK, "num_warps": cfg.num_warps}
    if cfg.num_stages is not None:
        meta["num_stages"] = cfg.num_stages
    if single:
        meta["xnumel"] = ek.xnumel
    if cfg.RBLOCK is not None:
        meta.update(rnumel=ek.rnumel, RBLOCK=cfg.RBLOCK)
    return (grid,), meta


def _time_config(fn, ek, cfg, single, bufs):
    grid, meta = launch_meta(ek, cfg, single)
    args = list(bufs) + ([] if single else [ek.xnumel])
    try:
        fn[grid](*args, **meta)  # compiles; a config that does not fit (registers, shared memory) fails here
        torch.cuda.synchronize()
        return bench_ms(lambda: fn[grid](*args, **meta))
    except Exception:  # noqa: BLE001 - a candidate that cannot run is simply not chosen
        return None


# --------------------------------------------------------------------------------------- matmul template

MM_OPS = ("mm", "addmm", "bmm")


class MMTemplate:
    """Called like ``aten.mm``/``addmm``/``bmm`` (positional tensors, ``beta``/``alpha`` keywords),
    runs ``ember_mm`` with one config; the output is contiguous, as the ATen op's is."""

    def __init__(self, op: str, config: dict, activation: str = ""):
        self.op, self.config, self.activation = op, dict(config), activation
        self._launch = None

    def __call__(self, *args, beta=1, alpha=1):
        if self.op == "addmm":
            bias, a, b = args
        else:
            (a, b), bias = args, None
        batched = self.op == "bmm"
        if not batched:
            a, b = a.unsqueeze(0), b.unsqueeze(0)
        nb, M, K = a.shape
        N = b.shape[-1]
        out = torch.empty((nb, M, N), dtype=a.dtype, device=a.device)
        has_bias = bias is not None and beta != 0
        if has_bias:
            bias = torch.broadcast_to(bias, (M, N)).unsqueeze(0)
        else:
            bias = out  # never read (HAS_BIAS is False): any pointer will do
        xs = bias.stride() if has_bias else (0, 0, 0)
        if self._launch is None:
            self._launch = self._make_launch(nb, M, N, K, a.dtype, has_bias)
        self._launch(a, b, out, bias, out, M, N, K, *a.stride(), *b.stride(), *out.stride(), *xs, float(alpha),
                     float(beta))  # (``out`` as Pre too: STORE_PRE is off)
        return out if batched else out[0]

    def _make_launch(self, nb, M, N, K, dtype, has_bias):
        from ember.native.runtime import Launch
        c = self.config
        precision = "tf32" if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"
        grid = (triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(N, c["BLOCK_N"]), nb)
        upcast = dtype == torch.bfloat16 and environment.triton_interpret
        meta = dict(HAS_BIAS=has_bias, ACTIVATION=self.activation, INPUT_PRECISION=precision, UPCAST=upcast,
                    EVEN_K=K % c["BLOCK_K"] == 0, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
                    BLOCK_K=c["BLOCK_K"], GROUP_M=8, STORE_PRE=False,
                    num_warps=c["num_warps"], num_stages=c["num_stages"])
        return Launch(ember_mm, grid, meta)

    def __repr__(self):
        return f"MMTemplate({self.op!r}, {self.config!r})"


def mm_candidates(M, N, K, dtype) -> list:
    bk = 32 if dtype == torch.float32 else 64
    # (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps); 128x256 and 256x128 spill registers on sm_90 with
    # this epilogue (ptxas -v), so the largest tile is 128x128
    configs = [(128, 128, bk, 3, 8), (128, 128, bk, 4, 8), (64, 128, bk, 4, 4), (128, 64, bk, 4, 4),
               (64, 64, bk, 4, 4)]
    from ember.native.triton_emit import next_pow2
    out = []
    for bm, bn, bkk, stages, warps in configs:
        if bm <= max(16, next_pow2(M)) and bn <= max(16, next_pow2(N)):
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bkk, num_stages=stages, num_warps=warps))
    return out or [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=2, num_warps=2)]


def _tensor_for(arg, layouts, device):
    lay = layouts[arg.name]
    base = _fill(torch.empty(max(1, lay.storage_numel), dtype=lay.dtype, device=device))
    return base.as_strided(arg.sizes, arg.strides, arg.offset)


def tune_matmul(e, layouts, base_dir):
    """``(global name, expression)`` of the template call to use instead of the ATen op, or None."""
    from ember.native.ir import BufferArg
    op = e.target._schema.name.split("::")[-1]
    tensors = [a for a in e.args if isinstance(a, BufferArg)]
    sig = [(layouts[a.name].dtype, a.sizes, a.strides) for a in tensors]
    scal = {k: v for k, v in e.kwargs.items() if not isinstance(v, BufferArg)}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    key = _key("mm", op, sig, sorted(scal.items()), tf32)
    hit = _load(key, base_dir)
    cached = hit is not None
    if hit is None:
        hit = _time_matmul(op, tensors, scal, e.target, layouts)
        _store(key, hit, base_dir)
    if hit.get("choice") != "template":
        return None, cached
    return f"MMTemplate({op!r}, {hit['config']!r})", cached


def _time_matmul(op, tensors, scal, target, layouts) -> dict:
    device = layouts[tensors[0].name].device
    args = [_tensor_for(a, layouts, device) for a in tensors]
    a, b = args[-2], args[-1]
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    ref = target(*args, **scal)
    best = {"choice": "extern", "ms": bench_ms(lambda: target(*args, **scal))}
    tol = 2e-2 if a.dtype in (torch.float16, torch.bfloat16) or torch.backends.cuda.matmul.allow_tf32 else 1e-4
    scale = float(ref.float().abs().max()) or 1.0
    for cfg in mm_candidates(M, N, K, a.dtype):
        tpl = MMTemplate(op, cfg)
        try:
            out = tpl(*args, **scal)
            if float((out.float() - ref.float()).abs().max()) > tol * scale:
                continue  # a template that does not reproduce cuBLAS is never chosen
            ms = bench_ms(lambda: tpl(*args, **scal))
        except Exception:  # noqa: BLE001 - configs that do not fit the device are skipped
            continue
        if ms < best["ms"] * (1 - MIN_GAIN):
            best = {"choice": "template", "ms": ms, "config": cfg}
    return best


# ----------------------------------------------------------------------------------------- the pass

def tune(sched, kernels: dict, layouts: dict, opts: NativeOptions, device) -> dict:
    """Tune every kernel launch site (``kernels``: id(step) -> (name, EmittedKernel, path); configs
    are replaced in place) and every matmul extern; returns ``{extern name: template expression}``."""
    from ember.native.ir import ExternNode
    from ember.native.scheduler import Kernel
    if skip_reason(device) is not None:
        return {}
    base_dir = opts.cache_dir
    sites = [s for s in sched.steps if isinstance(s, Kernel) and s.numel > 0]
    mms = [s for s in sched.steps if isinstance(s, ExternNode) and not s.multi
           and getattr(s.target, "_schema", None) is not None
           and s.target._schema.name.split("::")[-1] in MM_OPS and s.target._overloadname == "default"]
    bar = Progress(len(sites) + len(mms), "kernels and matmuls")
    for step in sites:
        name, ek, path = kernels[id(step)]
        fn = getattr(cache.load_module(path), name)
        ek.config, cached = tune_kernel(fn, ek, step.single, layouts, opts, base_dir)
        bar.step(cached)
    overrides = {}
    for e in mms:
        expr, cached = tune_matmul(e, layouts, base_dir)
        if expr is not None:
            overrides[e.name] = expr
        bar.step(cached)
    return overrides


def opts_for_key(opts: NativeOptions) -> dict:
    """The options that bound candidates (not paths or switches): part of a tuning entry's key."""
    return {"max_xblock": opts.max_xblock, "max_rblock": opts.max_rblock}
