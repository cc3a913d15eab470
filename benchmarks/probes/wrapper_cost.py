"""Probe: per-call time of ember's generated native wrapper, moved here from two unit tests whose
timed assertions flipped with the host's load (tests/native/test_launch.py and
tests/native/test_backend.py now check only what the wrapper does).

- ``stubbed``: the wrapper of ``x * 2 + 1`` (16 floats) with its launch replaced by a no-op: the
  Python that ember adds around the kernels (any machine; under TRITON_INTERPRET=1 without a GPU);
- ``gpu``: the real per-call time of a compiled ``softmax(x * 2)`` on a (64, 256) CUDA tensor, and
  eager's (GPU machines only).

usage: python benchmarks/probes/wrapper_cost.py [out.json]   (default: prints the JSON only)
"""
import json
import os
import platform
import sys
import tempfile
import time

if not os.environ.get("TRITON_INTERPRET") and not __import__("torch").cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # no GPU: Triton's interpreter stands in (as in the tests)

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.native import compile_aten_graph
from ember.native.cache import load_module
from ember.native.runtime import Launch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def best_us(fn, n, repeat=5, sync=lambda: None):
    for _ in range(min(n, 200)):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return round(best, 2)


def stubbed(cache_dir):
    x = torch.randn(16, device=DEVICE)
    gm = make_fx(lambda x: x * 2 + 1)(x)
    fn = compile_aten_graph(gm, [x], force_triton=True, options={"cache_dir": cache_dir})
    mod = load_module(fn.ember_native["wrapper"])
    launches = [v for v in vars(mod).values() if isinstance(v, Launch)]
    for v in launches:
        v.fast = (lambda *a: None, 1, 1, 1, lambda d: 0, 0, None, (), ((0, True),), (16,))
    return {"launches": len(launches), "us_per_call": best_us(lambda: fn(x), 5000)}


def gpu(cache_dir):
    x = torch.randn(64, 256, device="cuda")
    f = lambda x: torch.softmax(x * 2, -1)  # noqa: E731
    fn = compile_aten_graph(make_fx(f)(x), [x], options={"cache_dir": cache_dir})
    out = fn(x)
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, f(x))
    sync = torch.cuda.synchronize
    return {"device": torch.cuda.get_device_name(), "us_per_call": best_us(lambda: fn(x), 2000, sync=sync),
            "eager_us_per_call": best_us(lambda: f(x), 2000, sync=sync)}


def main():
    with tempfile.TemporaryDirectory() as d:
        out = {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
               "stubbed_wrapper": stubbed(d)}
        if torch.cuda.is_available():
            out["gpu_softmax"] = gpu(d)
    text = json.dumps(out, indent=1)
    if sys.argv[1:]:
        with open(sys.argv[1], "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
