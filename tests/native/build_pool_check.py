"""Kernel builds in worker processes, checked without a GPU (run by test_build_pool.py in a subprocess
without TRITON_INTERPRET): kernels are built for sm_90 by ``runtime.precompile`` with the build pool,
under a driver that only names the target, and every build the parent then does (as at a first
launch) must be a hit in Triton's disk cache, under the same hash the worker reported. Prints one JSON line."""
import glob
import json
import os
import signal
import sys
import tempfile

tmp = tempfile.mkdtemp(prefix="ember_build_pool_")
os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")

import torch  # noqa: E402
from triton.runtime import driver  # noqa: E402

from ember.native import build_pool, build_worker, cache, runtime, small_mm  # noqa: E402


class Driver(build_worker.TargetDriver):  # what the parent's build path asks of a driver (no GPU)
    def get_current_stream(self, device=None):
        return 0


driver.set_active(Driver("cuda", 90, 32))

KERNELS = '''import triton
import triton.language as tl
from ember.native.triton_helpers import *  # noqa: F401,F403


@triton.jit
def pointwise(in_ptr, out_ptr, n, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    m = x < n
    tl.store(out_ptr + x, erf_rational(tl.load(in_ptr + x, m)) * 2 + 1, m)


@triton.jit
def row_sum(in_ptr, out_ptr, RBLOCK: tl.constexpr):
    r = tl.arange(0, RBLOCK)
    tl.store(out_ptr + tl.program_id(0), tl.sum(tl.load(in_ptr + tl.program_id(0) * RBLOCK + r), 0))


@triton.jit
def broken(in_ptr, XBLOCK: tl.constexpr):
    tl.store(in_ptr + tl.arange(0, XBLOCK), undefined_name)
'''
mod = cache.load_module(cache.write_source("kernels", KERNELS, os.path.join(tmp, "ember")))
f32, bf16 = torch.float32, torch.bfloat16
sites = [runtime.Launch(mod.pointwise, (8,), {"XBLOCK": 128}, spec=(f32, f32, 1000)),
         runtime.Launch(mod.pointwise, (8,), {"XBLOCK": 128}, spec=(f32, f32, 1000)),  # the same build
         runtime.Launch(mod.pointwise, (8,), {"XBLOCK": 256}, spec=(bf16, bf16, 1000)),
         runtime.Launch(mod.row_sum, (64,), {"RBLOCK": 512}, spec=(f32, f32)),
         # ember's own matmul kernel (mm_kernel.py, imported by the worker under its package name)
         small_mm.SmallMM("addmm", 32, 64, 128, (128, 1), (1, 128), (0, 1), 1, 1,
                          small_mm.config(32, 64, 128, f32), f32).site,
         runtime.Launch(mod.broken, (1,), {"XBLOCK": 64}, spec=(f32,))]
assert build_pool.start(2) is not None
submitted = runtime.precompile(sites, threads=2)  # returns while the workers build
build_pool.wait()
# the parent's own builds, as a first launch does them (a call with aligned pointers): disk-cache hits
same = [s.fn.warmup(*s.spec, grid=s.grid, **s.meta).hash == s.ahead for s in sites[:5]]
binaries = len(glob.glob(os.path.join(tmp, "triton", "*", "*.cubin")))  # (the broken build leaves an empty dir)

# a dead worker costs its request, never a hang: kill one, then build a new variant
pool = build_pool.get()
pool.procs[0].kill()
pool.procs[0].wait()
late = runtime.Launch(mod.pointwise, (8,), {"XBLOCK": 64}, spec=(f32, f32, 999))
started = build_pool.build_ahead([late])
build_pool.wait()

# a new pool asked at once for builds it finds in the disk cache: each worker's "ready" line and its
# first answer arrive together (a buffered reader once swallowed the second: a hang)
signal.alarm(120)
build_pool._POOL = None
build_pool.start(2)
for s in sites[:5]:
    s.fn.device_caches.clear()  # (so that the parent asks again)
    s.ahead = None
again = build_pool.build_ahead(sites[:5])
build_pool.wait()
signal.alarm(0)
print(json.dumps(dict(submitted=submitted, stats=build_pool.STATS, binaries=binaries, same=same,
                      broken_ahead=sites[5].ahead, late=[started, late.ahead is not None], alive=len(pool.alive()),
                      again=[again] + [s.ahead is not None for s in sites[:5]])))
sys.stdout.flush()
