"""Device time of one small-matmul launch (``small_mm.SmallMM``, TF32 allowed: tf32x3) per tile
configuration, against ``torch.addmm``, for the batch-32 MLP's shapes (H100 probe).

    python benchmarks/probes/small_mm_configs.py

Times 20 launches replayed from a CUDA graph, so CPU-side cost is excluded.
"""
import torch, time
from ember.native.small_mm import SmallMM, config
torch.backends.cuda.matmul.allow_tf32 = True
def gpu_us(f, n=500):
    for _ in range(20): f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # device time: many launches back to back, CPU ahead (graph-free approximation)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20): f()
    g.replay(); torch.cuda.synchronize()
    e0.record()
    for _ in range(n // 20): g.replay()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1000 / n
for M, N, K in ((32, 1024, 512), (32, 1024, 1024), (32, 10, 1024)):
    a = torch.randn(M, K, device="cuda"); w = torch.randn(N, K, device="cuda"); bias = torch.randn(N, device="cuda")
    b = w.t()
    base = config(M, N, K, torch.float32)
    print(M, N, K, "default", base, "addmm", round(gpu_us(lambda: torch.addmm(bias, a, b)), 1))
    for bn in (16, 32, 64):
        for bk in (32, 64, 128):
            for st in (2, 3, 4):
                cfg = dict(base, BLOCK_N=bn, BLOCK_K=bk, num_stages=st)
                try:
                    s = SmallMM("addmm", M, N, K, a.stride(), b.stride(), (0, 1), 1, 1, cfg)
                    s(bias, a, b)
                    print(f"  BN{bn} BK{bk} st{st}: {gpu_us(lambda: s(bias, a, b)):.1f} us")
                except Exception as e:
                    print(f"  BN{bn} BK{bk} st{st}: {type(e).__name__}")
