"""GPU timings of the native backend against eager and torch.compile (peer), run by hand on a CUDA
machine: ``python tests/native/gpu_bench.py``. Prints one JSON line per workload: microseconds per
call (CUDA-event timing via triton.testing.do_bench), achieved bandwidth for the fused kernels, and
the compiled graph's kernel count. Not collected by pytest."""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from ember.native import compile_aten_graph  # noqa: E402
from tests.native.harness import trace  # noqa: E402


def bench(fn, args):
    from triton.testing import do_bench
    return do_bench(lambda: fn(*args), warmup=25, rep=100) * 1e3  # us


def overhead(fn, args, n=300):
    for _ in range(20):
        fn(*args)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


PEER = {"softmax_f32", "layer_norm_bf16", "cross_entropy_f32", "tiny_softmax_overhead", "add_relu_f32_2^24"}


def main():
    d = "cuda"
    torch.manual_seed(0)
    M, N = 8192, 4096
    work = [
        ("add_relu_f32_2^24", lambda a, b: torch.relu(a + b), [torch.randn(1 << 24, device=d), torch.randn(1 << 24, device=d)]),
        ("softmax_f32", lambda x: torch.softmax(x, -1), [torch.randn(M, N, device=d)]),
        ("softmax_bf16", lambda x: torch.softmax(x, -1), [torch.randn(M, N, device=d, dtype=torch.bfloat16)]),
        ("layer_norm_bf16", lambda x, w, b: F.layer_norm(x, (N,), w, b),
         [torch.randn(M, N, device=d, dtype=torch.bfloat16), torch.randn(N, device=d, dtype=torch.bfloat16),
          torch.randn(N, device=d, dtype=torch.bfloat16)]),
        ("rms_norm_bf16", lambda x, w: F.rms_norm(x, (N,), w, eps=1e-6),
         [torch.randn(M, N, device=d, dtype=torch.bfloat16), torch.randn(N, device=d, dtype=torch.bfloat16)]),
        ("softmax_f32_rows32k", lambda x: torch.softmax(x, -1), [torch.randn(512, 32768, device=d)]),
        ("sum_dim0_f32", lambda x: x.sum(0), [torch.randn(M, N, device=d)]),
        ("gelu_linear_bf16", lambda x, w, b: F.gelu(x @ w + b),
         [torch.randn(4096, 4096, device=d, dtype=torch.bfloat16), torch.randn(4096, 4096, device=d, dtype=torch.bfloat16),
          torch.randn(4096, device=d, dtype=torch.bfloat16)]),
        ("cross_entropy_f32", lambda x, t: F.cross_entropy(x, t), [torch.randn(4096, 32000, device=d),
                                                                  torch.randint(0, 32000, (4096,), device=d)]),
        ("tiny_softmax_overhead", lambda x: torch.softmax(x * 2, -1), [torch.randn(64, 256, device=d)]),
    ]
    if len(sys.argv) > 1:  # variants: name=json options, e.g. softmax_f32='{"persistent_rnumel": 4096}'
        base = {w[0]: w for w in work}
        work = []
        for spec in sys.argv[1:]:
            name, _, opts = spec.partition("=")
            work.append((f"{name} {opts}", base[name][1], base[name][2], json.loads(opts or "{}")))
    for w in work:
        name, fn, args = w[:3]
        options = w[3] if len(w) > 3 else {}
        row = {"name": name}
        try:
            t0 = time.perf_counter()
            gm = trace(fn, args)
            native = compile_aten_graph(gm, args, options=options)
            out = native(*args)
            row["compile_s"] = round(time.perf_counter() - t0, 2)
            ref = fn(*args)
            out = out[0] if isinstance(out, (list, tuple)) else out
            row["max_err"] = float((out.float() - ref.float()).abs().max())
            row["kernels"] = native.ember_native["report"]["kernels"]
            nbytes = native.ember_native["report"]["kernel_bytes"]
            row["eager_us"] = round(bench(fn, args), 1)
            row["ember_us"] = round(bench(native, args), 1)
            if "overhead" in name or options.get("overhead"):
                row["ember_call_us"] = round(overhead(native, args), 1)
                row["eager_call_us"] = round(overhead(fn, args), 1)
            if "linear" not in name:
                row["ember_GBps"] = round(nbytes / row["ember_us"] / 1e3, 1)
            try:
                if name not in PEER or options:
                    raise StopIteration
                peer = torch.compile(fn)
                peer(*args)
                row["inductor_us"] = round(bench(peer, args), 1)
            except StopIteration:
                pass
            except Exception as e:  # the peer is optional
                row["inductor"] = f"failed: {type(e).__name__}"
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
