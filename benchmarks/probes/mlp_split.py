"""Probe (H100): per-call CPU time of the batch-32 MLP (parameters need grad), layer by layer: the full
ember call, its autograd variant, the generated wrapper, and the raw ATen ops (addmm alone).
usage: python benchmarks/probes/mlp_split.py"""
import sys, os, time, torch
import ember, ember.native.backend as nb, ember.aot.runtime as rt
DEV = "cuda"
torch.manual_seed(0)
d0, d1, b = 512, 1024, 32
mod = torch.nn.Sequential(torch.nn.Linear(d0, d1), torch.nn.GELU(), torch.nn.Linear(d1, d1), torch.nn.GELU(), torch.nn.Linear(d1, 10)).to(DEV).eval()
x = torch.randn(b, d0, device=DEV)
calls, vargs = [], []
orig = nb._compile
def rec(gm, ex, opts):
    c = orig(gm, ex, opts); calls.append(c); return c
nb._compile = rec
ocall = rt.TrainingVariant.__call__
def vrec(self, *args):
    if not vargs: vargs.append((self, args))
    return ocall(self, *args)
rt.TrainingVariant.__call__ = vrec
cm = ember.compile(mod)
cm(x); cm(x)
rt.TrainingVariant.__call__ = ocall
var, args = vargs[0]
fw = calls[0]
fw_args = [args[i] for i in var._tidx]
print("forward wrapper args", len(fw_args))
def t(fn, n=3000):
    for _ in range(100): fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        s = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - s) / n * 1e6)
    torch.cuda.synchronize(); return round(best, 1)
with torch.no_grad():
    nog = t(lambda: fw(*fw_args))
ws = [mod[0].weight, mod[2].weight, mod[4].weight]; bs = [mod[0].bias, mod[2].bias, mod[4].bias]
addmm = torch.ops.aten.addmm.default
def raw():
    h = addmm(bs[0], x, ws[0].t()); h = torch.nn.functional.gelu(h); h = addmm(bs[1], h, ws[1].t()); h = torch.nn.functional.gelu(h)
    return addmm(bs[2], h, ws[2].t())
with torch.no_grad():
    rawt = t(raw)
    rawt_addmm = t(lambda: addmm(bs[0], x, ws[0].t()))
    rawt_addmm_op = t(lambda: addmm._op(bs[0], x, ws[0].t()))
    rawt_t = t(lambda: ws[0].t())
    rawt_as = t(lambda: torch.as_strided(ws[0], (512, 1024), (1, 512), ws[0].storage_offset()))
    rawt_stride = t(lambda: x.stride())
    rawt_shape = t(lambda: x.shape != (32, 512))
print("eager module (grad)", t(lambda: mod(x)))
with torch.no_grad():
    print("eager module no_grad", t(lambda: mod(x)))
print("ember full          ", t(lambda: cm(x)))
print("aot variant         ", t(lambda: var(*args)))
print("fw wrapper (no_grad)", nog)
print("fw wrapper (grad on)", t(lambda: fw(*fw_args)))
print("raw aten no_grad    ", rawt, "| addmm", rawt_addmm, "addmm._op", rawt_addmm_op, ".t()", rawt_t, "as_strided", rawt_as, "stride()", rawt_stride, "shape!=", rawt_shape)
fn = var.function
print("Function.apply C    ", t(lambda: var._c_apply(*fw_args)))
