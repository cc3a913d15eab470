"""Probe (H100): the fixed cost of a first compile in a fresh process, before any work of ember's own:
importing ember, the torch stack that FakeTensorMode/ShapeEnv/make_fx import (torch._dynamo among
it), Triton's cache key and its driver. Run twice with one TRITON_CACHE_DIR (cold, then warm):

    TRITON_CACHE_DIR=/tmp/tf python benchmarks/probes/cold_floor.py cold
    TRITON_CACHE_DIR=/tmp/tf python benchmarks/probes/cold_floor.py warm
"""
import sys
import time
import torch
x = torch.randn(16, device="cuda"); torch.cuda.synchronize()
r = {}
def step(name, fn):
    t = time.perf_counter(); fn(); r[name] = round(time.perf_counter() - t, 3)
step("import ember", lambda: __import__("ember"))
step("import torch._dynamo", lambda: __import__("torch._dynamo"))
def fake():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    FakeTensorMode(shape_env=ShapeEnv())
step("FakeTensorMode+ShapeEnv", fake)
def mfx():
    from torch.fx.experimental.proxy_tensor import make_fx
    make_fx(lambda a: a * 2 + 1)(torch.randn(4))
step("make_fx trivial", mfx)
step("import triton", lambda: __import__("triton.language"))
def key():
    from triton.runtime.cache import triton_key; triton_key()
step("triton_key", key)
def drv():
    from triton.runtime import driver; driver.active.get_current_target()
step("driver.active (cold cache)" if sys.argv[1:] == ["cold"] else "driver.active", drv)
print("floor", r, "sum", round(sum(r.values()), 3))
