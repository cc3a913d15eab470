"""First-call time of a gpu_suite workload under ember, as the suite measures it: wrapping plus the
first call, ``import ember`` included (H100 probe). Cold, then warm, with a thread count:

    EMBER_COMPILE_THREADS=1 EMBER_CACHE_DIR=/tmp/c1 TRITON_CACHE_DIR=/tmp/t1 python benchmarks/probes/first_call.py gpt2_infer
    EMBER_CACHE_DIR=/tmp/c16 TRITON_CACHE_DIR=/tmp/t16 python benchmarks/probes/first_call.py gpt2_infer
"""
import sys, os, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
import gpu_suite as gs
wl = sys.argv[1]
torch.manual_seed(0)
build, inputs, nb = gs.make(wl, "cuda", False)
torch.cuda.synchronize()
t0 = time.perf_counter()
step = build(gs.compiler_fn("ember", "default"))
step(*inputs); torch.cuda.synchronize()
print(f"{wl} threads={os.environ.get('EMBER_COMPILE_THREADS')} first call {time.perf_counter() - t0:.2f} s", flush=True)
