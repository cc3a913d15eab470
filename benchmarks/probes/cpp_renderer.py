"""Quick C++-renderer probe (issue 25): eager vs ember with EMBER native_cpu=<mode>, 1 thread, medians of 30.
Usage (from the repository root): PYTHONPATH=. python benchmarks/probes/cpp_renderer.py cpp|aten   (numbers in the t25-cpp report; noisy shared VM)"""
import statistics, time, sys, copy
import torch, torch.nn.functional as F
torch.set_num_threads(1)
import ember
from ember.config import config
from ember.native import cpp_build
import tempfile
config.cache_dir = tempfile.mkdtemp()

def med(fn, *a, n=30):
    for _ in range(3): fn(*a)
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(*a); ts.append(time.perf_counter() - t)
    return statistics.median(ts)

ln = torch.nn.LayerNorm(1024)
mlp = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10))
W = {
  "layer_norm+gelu 1024x1024": (lambda x: F.gelu(ln(x)), [torch.randn(1024, 1024)]),
  "softmax 1024x1024": (lambda x: torch.softmax(x, -1), [torch.randn(1024, 1024)]),
  "softmax 8192x1024": (lambda x: torch.softmax(x, -1), [torch.randn(8192, 1024)]),
  "mlp b32 fwd": (lambda x: mlp(x), [torch.randn(32, 512)]),
}
mode = sys.argv[1]
def train(x, y):
    loss = F.cross_entropy(mlp(x), y)
    loss.backward()
    return loss.detach()

config.native_cpu = mode
with torch.no_grad():
    for name, (fn, args) in W.items():
        eager = med(fn, *args)
        c = ember.compile(fn)
        b0, s0 = cpp_build.BUILDS["count"], cpp_build.BUILDS["seconds"]
        t = time.perf_counter(); out = c(*args); cold = time.perf_counter() - t
        torch.testing.assert_close(out, fn(*args), atol=1e-4, rtol=1e-4)
        mine = med(c, *args)
        print(f"{mode:5s} {name:28s} eager {eager*1e3:7.3f} ms  ember {mine*1e3:7.3f} ms  speedup {eager/mine:5.2f}x  "
              f"cold {cold:5.2f}s  gcc runs {cpp_build.BUILDS['count']-b0} {cpp_build.BUILDS['seconds']-s0:.2f}s", flush=True)

name = "mlp b32 train step"
x, y = torch.randn(32, 512), torch.randint(0, 10, (32,))
eager = med(train, x, y)
c = ember.compile(train)
b0, s0 = cpp_build.BUILDS["count"], cpp_build.BUILDS["seconds"]
t = time.perf_counter(); c(x, y); cold = time.perf_counter() - t
mine = med(c, x, y)
print(f"{mode:5s} {name:28s} eager {eager*1e3:7.3f} ms  ember {mine*1e3:7.3f} ms  speedup {eager/mine:5.2f}x  "
      f"cold {cold:5.2f}s  gcc runs {cpp_build.BUILDS['count']-b0} {cpp_build.BUILDS['seconds']-s0:.2f}s", flush=True)
