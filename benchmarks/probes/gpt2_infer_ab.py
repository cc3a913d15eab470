"""Probe (H100): GPT-2 inference (gpu_suite's gpt2_infer: HF GPT-2 124M, batch 8 x 512, bf16) under
ember's reduce-overhead mode, with session 39's changes against the code before them, in one process:

- ``pad_mm_rows`` (ember/native/pad_mm.py): the logits matmul writes its padded rows directly
  (``ember_native::mm_rows``) instead of copying the tied embedding padded to 50264 rows every call
  (``triton_poi_fused_constant_pad_nd_permute_*``, ~0.05 ms in session 38's profile);
- ``REALIZE_FULL_READS`` (ember/native/lowering.py): the residual stream is stored once it reads
  three full-size buffers, so each LayerNorm kernel reads the last stored stream and one branch
  output instead of up to five buffers (the ``add_..._var_mean_...`` kernels);
- and, as a third variant ``after+flash``, native option ``sdpa_flash`` (ember/native/sdpa.py, off by
  default): the attention as FlashAttention-2 instead of cuDNN's, which zeroes its philox seed and
  offset every call (24 of the 25 ``Memset`` nodes per call).

    python benchmarks/probes/gpt2_infer_ab.py                  # the three variants, SDPA, K/V copy
    python benchmarks/probes/gpt2_infer_ab.py --out /tmp/gpt2_ab.json --loops 7

The variants are compiled with the on-disk graph cache off (``before`` is the same graph compiled
under the old settings). Then, in turn (``--loops`` rounds): ms per call
from CUDA events around ``--calls`` calls (gpu_suite's measure); for each variant one profiled run
of 3 calls (device time and kernels per call, the top kernels, and the kernel sequence of one call,
to show where each ``Memset`` comes from); the logits' largest difference from eager's. Last, the
attention alone as eager SDPA on strided q/k/v (as GPT-2 passes them), with each CUDA backend
(cuDNN's zeroes its philox seed and offset on every call: two ``Memset`` nodes per layer), and the K/V
cache copy as a Triton kernel with other block sizes (``kv_copy``: data for the pointwise configs).

What proves the gain: ``after`` has no ``constant_pad_nd`` kernel, one kernel fewer per call, LayerNorm
kernel time lower than ``before``'s, device time per call lower by about the sum, and ms per call
lower by at least as much (reduce-overhead replays the whole graph: fewer kernels, fewer gaps);
``max_abs_err`` the same size for both (bf16 rounding: ~0.04 in session 38's gpu_suite). ``after+flash``
has no memsets (but one attention kernel of another speed): if its ms per call is lower than
``after``'s, ``sdpa_flash`` is worth turning on by default.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/ (gpu_suite)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository (ember)


# variant -> (old code's settings, NativeOptions overrides)
VARIANTS = {
    "before": (True, (("pad_mm_rows", False),)),
    "after": (False, ()),
    "after+flash": (False, (("sdpa_flash", True),)),
}


def build(variant: str, ids, model):
    """gpu_suite's inference step on ``model`` compiled as reduce-overhead does (on-disk graph cache
    off) with the variant's settings; called 4 times (compile, warm-up, recording of the CUDA graph,
    a replay). The realize rule is a class constant: set only while this graph compiles."""
    import torch

    import ember
    from ember.backends.ember_backend import _native_backend
    from ember.native import lowering
    old, overrides = VARIANTS[variant]
    backend = _native_backend(cudagraphs=True, overrides=(("cache", False), *overrides))
    cm = ember.compile(model, backend=backend)

    def step(x):
        with torch.no_grad():
            return cm(x).logits
    saved = lowering.GraphLowering.REALIZE_FULL_READS
    lowering.GraphLowering.REALIZE_FULL_READS = 10 ** 9 if old else saved
    try:
        for _ in range(4):
            step(ids)
        torch.cuda.synchronize()
    finally:
        lowering.GraphLowering.REALIZE_FULL_READS = saved
    return step


def time_loop(step, ids, calls: int) -> float:
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        step(ids)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def profile(step, ids, calls: int = 3, top: int = 16) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step(ids)
        torch.cuda.synchronize()
    rows = sorted((k for k in prof.key_averages() if k.device_type.name == "CUDA" and k.device_time_total > 0),
                  key=lambda k: -k.device_time_total)
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and e.device_time_total > 0),
                    key=lambda e: e.time_range.start)
    per_call = len(events) // calls
    ln = sum(k.device_time_total for k in rows if "var_mean" in k.key) / calls / 1e3
    return {
        "device_ms_per_call": round(sum(k.device_time_total for k in rows) / calls / 1e3, 4),
        "kernels_per_call": per_call,
        "layernorm_kernels_ms": round(ln, 4),
        "pad_kernels": sum(k.count for k in rows if "constant_pad_nd" in k.key) // calls,
        "top": [f"{k.device_time_total / calls / 1e3:.4f} ms x{k.count // calls} {k.key[:100]}" for k in rows[:top]],
        "one_call": [f"{e.device_time_total:.1f} us {e.name[:80]}" for e in events[-per_call:]],
    }


def sdpa_backends() -> dict:
    """Eager SDPA on GPT-2's q/k/v (views of the [8, 512, 2304] QKV projection, k and v also as the
    contiguous copies the cache keeps), causal, with each backend: wall and device us per call, and the
    kernels of one call."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile as tprofile
    qkv = torch.randn(8, 512, 2304, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.view(8, 512, 12, 64).transpose(1, 2) for t in qkv.split(768, dim=2))
    out = {}
    for kv in ("strided", "contiguous"):
        kk, vv = (k, v) if kv == "strided" else (k.contiguous(), v.contiguous())
        for b in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            try:
                with sdpa_kernel([b]):
                    f = lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, scale=0.125)  # noqa: E731
                    f()
                    ms = statistics.median(time_loop(lambda _: f(), None, 50) for _ in range(5))
                    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(10):
                            f()
                        torch.cuda.synchronize()
                evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
                # (wall us may be the host's launch cost; device us is what a replayed graph spends)
                out[f"{b.name}/{kv}"] = {"wall_us": round(ms * 1e3, 2),
                                         "device_us": round(sum(e.device_time_total for e in evs) / 10, 2),
                                         "kernels": [e.name[:70] for e in evs[:len(evs) // 10]]}
            except Exception as e:  # noqa: BLE001 - a backend that declines these inputs says why
                out[f"{b.name}/{kv}"] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
    return out


def _kv_kernels():
    """The two K/V copy kernels (defined at first use: Triton's JIT wants ``tl`` among its globals)."""
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def out_order(in_ptr0, out_ptr0, out_ptr1, XBLOCK: tl.constexpr):  # ember's kernel, verbatim index math
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        v0 = xindex // 393216
        v1 = (xindex // 32768) % 12
        v2 = (xindex // 64) % 512
        v3 = xindex % 64
        t0 = tl.load(in_ptr0 + (768 + 1179648 * v0 + 64 * v1 + 2304 * v2 + v3)).to(tl.float32)
        tl.store(out_ptr0 + (393216 * v0 + 32768 * v1 + 64 * v2 + v3), t0.to(tl.bfloat16))
        t1 = tl.load(in_ptr0 + (1536 + 1179648 * v0 + 64 * v1 + 2304 * v2 + v3)).to(tl.float32)
        tl.store(out_ptr1 + (393216 * v0 + 32768 * v1 + 64 * v2 + v3), t1.to(tl.bfloat16))

    @triton.jit
    def src_order(in_ptr0, out_ptr0, out_ptr1, XBLOCK: tl.constexpr):  # rows of K|V per token
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        tok = xindex // 1536
        c = xindex % 1536
        b = tok // 512
        s = tok % 512
        t = tl.load(in_ptr0 + (768 + 2304 * tok + c))
        o = 393216 * b + 32768 * ((c % 768) // 64) + 64 * s + c % 64
        tl.store(out_ptr0 + o, t, mask=c < 768)
        tl.store(out_ptr1 + o, t, mask=c >= 768)
    return out_order, src_order


def kv_copy_sweep(device: str = "cuda", configs=((1024, 2048, 4096), (4, 8)), repeats: int = 20) -> dict:
    """The per-layer K/V cache copy (``triton_poi_fused_cat_*``: K and V out of the [8, 512, 2304] QKV
    projection into contiguous [8, 12, 512, 64] tensors, 12.6 MB moved, ~6.7 us in session 38/39's
    profiles, ~1.9 TB/s) as ember emits it (1-D over the output, XBLOCK 1024, 4 warps) and with other
    block sizes and warps, and in the source's order (one contiguous 1536-element read per token):
    device us per launch from the profiler, against ATen's copy of the same permuted views."""
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile
    out_order, src_order = _kv_kernels()
    qkv = torch.randn(8, 512, 2304, device=device, dtype=torch.bfloat16)
    k_ref, v_ref = (t.view(8, 512, 12, 64).transpose(1, 2).contiguous() for t in qkv.split(768, 2)[1:])
    n = k_ref.numel()
    runs = {"aten_copy": lambda k, v: (k.copy_(qkv[..., 768:1536].view(8, 512, 12, 64).transpose(1, 2)),
                                       v.copy_(qkv[..., 1536:].view(8, 512, 12, 64).transpose(1, 2)))}
    for kern, total in ((out_order, n), (src_order, 2 * n)):
        for xb in configs[0]:
            for warps in configs[1]:
                runs[f"{kern.__name__}/X{xb}/w{warps}"] = (
                    lambda k, v, kern=kern, xb=xb, warps=warps, total=total:
                    kern[(total // xb,)](qkv, k, v, XBLOCK=xb, num_warps=warps))
    cuda = device == "cuda"
    out = {}
    for name, fn in runs.items():
        k, v = torch.empty_like(k_ref), torch.empty_like(v_ref)
        fn(k, v)
        ok = bool(torch.equal(k, k_ref) and torch.equal(v, v_ref))
        with tprofile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(repeats):
                fn(k, v)
            if cuda:
                torch.cuda.synchronize()
        us = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA") / repeats
        out[name] = {"us": round(us, 2), "GBps": round(4 * n * 2 / us / 1e3, 1) if us else None, "equal": ok}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loops", type=int, default=5)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpt2_infer_ab needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)  # gpu_suite.make's gpt2_infer
    cfg._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(cfg).to("cuda").eval().to(torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda")
    with torch.no_grad():
        ref = model(ids).logits.float()
    steps = {name: build(name, ids, model) for name in VARIANTS}
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "variants": {}}
    ms = {name: [] for name in steps}
    for _ in range(args.loops):
        for name, step in steps.items():
            ms[name].append(time_loop(step, ids, args.calls))
    for name, step in steps.items():
        err = (step(ids).float() - ref).abs().max().item()
        res["variants"][name] = {"ms_per_call": round(statistics.median(ms[name]), 4),
                                 "ms_loops": [round(x, 4) for x in ms[name]], "max_abs_err": err,
                                 **profile(step, ids)}
    keys = ("ms_per_call", "device_ms_per_call", "kernels_per_call", "layernorm_kernels_ms", "pad_kernels",
            "max_abs_err")
    v = res["variants"]
    res["summary"] = {k: " -> ".join(f"{name} {v[name][k]}" for name in VARIANTS) for k in keys}
    res["sdpa_backends"] = sdpa_backends()
    res["kv_copy"] = kv_copy_sweep()
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
