"""Probe (H100): CPU time per call of the pieces of the batch-32 MLP's first SmallMM (a fused
addmm+GELU): allocation, the Triton launch (raw C launcher), the whole SmallMM call; against one
ATen addmm, the eager module and the compiled one. usage: python benchmarks/probes/small_mm_launch.py
"""
import time
import torch
import ember, ember.native.backend as nb
from ember.native import cache
torch.manual_seed(0)
mod = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10)).cuda().eval()
x = torch.randn(32, 512, device="cuda")
calls = []
orig = nb._compile
nb._compile = lambda gm, ex, opts: calls.append(orig(gm, ex, opts)) or calls[-1]
cm = ember.compile(mod)
cm(x); cm(x)
w = cache.load_module(calls[0].ember_native["wrapper"])
t0 = [getattr(w, n) for n in dir(w) if n.startswith("template_")][0]
print(t0, t0.site.fast is not None)
def t(fn, n=3000):
    for _ in range(100): fn()
    torch.cuda.synchronize(); best = 1e9
    for _ in range(3):
        s = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - s) / n * 1e6)
    torch.cuda.synchronize(); return round(best, 2)
W, B = mod[0].weight.detach(), mod[0].bias.detach()
out = torch.empty(32, 1024, device="cuda")
site = t0.site
print("torch.empty           ", t(lambda: torch.empty((32, 1024), dtype=torch.float32, device=x.device)))
print("empty_strided DEV0    ", t(lambda: torch.empty_strided((32, 1024), (1024, 1), device=x.device, dtype=torch.float32)))
print("site(a,b,out,bias,pre)", t(lambda: site(x, W, out, B, out)))
print("SmallMM call          ", t(lambda: t0(B, x, W)))
fast = site.fast
launch, g0, g1, g2, stream, device, function, extra, checks, consts = fast
print("n consts", len(consts), "extra", [type(e).__name__ for e in extra])
print("raw launch            ", t(lambda: launch(g0, g1, g2, stream(device), function, *extra, x, W, out, B, out, *consts)))
print("stream(device)        ", t(lambda: stream(device)))
print("addmm                 ", t(lambda: torch.addmm(B, x, W.t())))
print("eager module          ", t(lambda: mod(x)))
print("ember module          ", t(lambda: cm(x)))
