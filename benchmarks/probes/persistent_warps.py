"""Probe (H100): warps of persistent reductions. Each case is compiled by ember with its heuristic config
("default"), then with the warps forced to 2..16; prints the bandwidth as a share of an fp32 8192^2 copy
(and the bf16 8192x4096 copy's GB/s, the gpu_suite ln_gelu row's reference).
usage: python benchmarks/probes/persistent_warps.py   (ONLY=ln_gelu: the cases whose name contains it)"""
import tempfile, warnings, torch, ember, ember.native.triton_emit as te
warnings.filterwarnings("error", message="ember")  # a graph run eagerly must not pass as a measurement
F = torch.nn.functional
orig = te.choose_config
FORCE = {}
def patched(k, options, inner, persistent_ok=True, **kw):
    c = orig(k, options, inner, persistent_ok, **kw)
    if c.persistent and k.is_reduction and "w" in FORCE:
        c.num_warps = FORCE["w"]
    return c
te.choose_config = patched
def t(fn, n=200):
    for _ in range(10): fn()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record()
    for _ in range(n): fn()
    e.record(); e.synchronize(); return s.elapsed_time(e) / n
CASES = {
 "ln_gelu_bf16_4096": (lambda x, w, b: F.gelu(F.layer_norm(x, (x.shape[1],), w, b)), (8192, 4096), torch.bfloat16, True),
 "ln_bf16_4096": (lambda x, w, b: F.layer_norm(x, (x.shape[1],), w, b), (8192, 4096), torch.bfloat16, True),
 "ln_f32_4096": (lambda x, w, b: F.layer_norm(x, (x.shape[1],), w, b), (8192, 4096), torch.float32, True),
 "softmax_f32_4096": (lambda x: torch.softmax(x, -1), (8192, 4096), torch.float32, False),
 "softmax_bf16_2048": (lambda x: torch.softmax(x, -1), (16384, 2048), torch.bfloat16, False),
 "ln_gelu_bf16_768": (lambda x, w, b: F.gelu(F.layer_norm(x, (x.shape[1],), w, b)), (65536, 768), torch.bfloat16, True),
 "softmax_f32_8192": (lambda x: torch.softmax(x, -1), (8192, 8192), torch.float32, False),
}
x0 = torch.randn(8192, 8192, device="cuda"); y0 = torch.empty_like(x0)
cp = min(t(lambda: y0.copy_(x0)) for _ in range(3)); copy_bw = 2 * x0.numel() * 4 / cp / 1e6
xb = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16); yb = torch.empty_like(xb)
cpb = min(t(lambda: yb.copy_(xb)) for _ in range(3))
print(f"copy {copy_bw:.0f} GB/s (fp32 8192^2); bf16 8192x4096 copy {2 * xb.numel() * 2 / cpb / 1e6:.0f} GB/s")
import os
ONLY = os.environ.get('ONLY')
for name, (fn, shape, dt, wb) in CASES.items():
    if ONLY and ONLY not in name: continue
    x = torch.randn(*shape, device="cuda", dtype=dt)
    args = (x, torch.randn(shape[1], device="cuda", dtype=dt), torch.randn(shape[1], device="cuda", dtype=dt)) if wb else (x,)
    row = []
    for w in (None, 2, 4, 8, 16):
        FORCE.clear()
        if w: FORCE["w"] = w
        ember.reset(); ember.config.cache_dir = tempfile.mkdtemp()
        cf = ember.compile(lambda *a: fn(*a))
        cf(*args)
        ms = min(t(lambda: cf(*args)) for _ in range(2))
        row.append(f"{'default' if w is None else w}:{2 * x.numel() * x.element_size() / ms / 1e6 / copy_bw * 100:.0f}%")
    print(name, " ".join(row))
