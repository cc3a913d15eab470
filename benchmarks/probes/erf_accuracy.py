"""Probe (GPU): ember's erf_rational and libdevice's erf against float64 erf over [-6, 6] and tiny
arguments: max absolute error, max float32 ulps, max relative error near 0.
usage: python benchmarks/probes/erf_accuracy.py"""
import torch, triton, triton.language as tl
from ember.native.triton_helpers import erf_rational
@triton.jit
def k(x_ptr, y_ptr, z_ptr, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B); m = o < n
    x = tl.load(x_ptr + o, m)
    tl.store(y_ptr + o, erf_rational(x), m); tl.store(z_ptr + o, tl.math.erf(x), m)
x = torch.linspace(-6, 6, 4_000_001, device="cuda", dtype=torch.float32)
x = torch.cat([x, torch.logspace(-30, 0.8, 100000, device="cuda"), -torch.logspace(-30, 0.8, 100000, device="cuda")])
y = torch.empty_like(x); z = torch.empty_like(x)
k[(triton.cdiv(x.numel(), 1024),)](x, y, z, x.numel(), B=1024)
ref = torch.erf(x.double())
ulp = lambda r: (torch.nextafter(r.float().abs(), torch.tensor(float("inf"), device="cuda")) - r.float().abs()).double()
for name, v in (("erf_rational (fast division)", y), ("libdevice", z)):
    err = (v.double() - ref).abs()
    print(name, "max abs", err.max().item(), "max ulps", (err / ulp(ref)).max().item(), "max rel |x|<1e-3", (err / ref.abs())[x.abs() < 1e-3].max().item())
