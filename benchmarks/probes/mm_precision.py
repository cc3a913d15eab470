"""Probe (H100): the batch-32 MLP under TF32: eager's error against float64, and small_mm's Triton matmul
at each input precision (tf32, tf32x3, ieee) against eager and float64.
usage: python benchmarks/probes/mm_precision.py"""
import torch, ember
import ember.native.small_mm as sm
torch.backends.cuda.matmul.allow_tf32 = True
torch.manual_seed(0)
d0, d1, b = 512, 1024, 32
m = torch.nn.Sequential(torch.nn.Linear(d0, d1), torch.nn.GELU(), torch.nn.Linear(d1, d1), torch.nn.GELU(), torch.nn.Linear(d1, 10)).cuda().eval()
x = torch.randn(b, d0, device="cuda")
eager = m(x).detach()
m64 = m.double(); r64 = m64(x.double()).detach(); m.float()
scale = r64.abs().max().item()
print(f"eager tf32 vs fp64: rel {(eager.double() - r64).abs().max().item() / scale:.3g}")
orig = sm.SmallMM._launch
for prec in ("tf32", "tf32x3", "ieee"):
    def patched(self, dtype, tf32, prec=prec):
        L = orig(self, dtype, tf32)
        L.meta["INPUT_PRECISION"] = prec if dtype == torch.float32 else L.meta["INPUT_PRECISION"]
        return L
    sm.SmallMM._launch = patched
    import gc
    for o in gc.get_objects():
        if isinstance(o, sm.SmallMM): o.launches.clear()
    out = ember.compile(torch.nn.Sequential(*m))(x).detach()
    print(f"SmallMM {prec}: vs eager rel {(out - eager).abs().max().item() / eager.abs().max().item():.3g}, vs fp64 rel {(out.double() - r64).abs().max().item() / scale:.3g}")
