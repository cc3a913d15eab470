"""gpt2_train steady step: cuDNN attention (default) vs flash (cuDNN SDPA off), eager and ember, and host jitter.

    python benchmarks/probes/gpt2_train_attn.py cudnn|flash|cudnn-pin ember|eager out.jsonl
    Results: benchmarks/results/gpt2_train-attn-jitter-h100-s41.json
"""
import json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
variant, compiler, out = sys.argv[1], sys.argv[2], sys.argv[3]
if "pin" in variant:
    os.sched_setaffinity(0, {3})
if "flash" in variant:
    torch.backends.cuda.enable_cudnn_sdp(False)
from gpu_suite import make, compiler_fn
torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True
torch.manual_seed(0)
build, inputs, _ = make("gpt2_train", "cuda", False)
step = build(compiler_fn(compiler, "default"))
t0 = time.perf_counter(); torch.manual_seed(1); loss = step(*inputs); torch.cuda.synchronize(); first = time.perf_counter() - t0
for _ in range(5):
    step(*inputs)
torch.cuda.synchronize()
ms, host = [], []
for _ in range(9):
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record(); h0 = time.perf_counter()
    for _ in range(20):
        step(*inputs)
    host.append(round((time.perf_counter() - h0) / 20 * 1e3, 3))
    e.record(); torch.cuda.synchronize(); ms.append(round(s.elapsed_time(e) / 20, 3))
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        step(*inputs)
    torch.cuda.synchronize()
kern = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0 and not e.key.startswith(("aten::", "autograd::", "Optimizer", "Compiled"))) / 3 / 1e3
rec = dict(variant=variant, compiler=compiler, first_s=round(first, 3), loss=float(loss), ms_med=sorted(ms)[4], ms_min=min(ms), ms=ms, host=host, kernel_ms=round(kern, 3))
print(json.dumps(rec), flush=True)
open(out, "a").write(json.dumps(rec) + "\n")
