"""Probe (H100; runs on CPU with stand-in launches): where the host time of one call of gpu_suite's
``overhead`` row goes (``x * 2 + 1`` on 16 floats, one fused Triton kernel). Each line times one
layer of the call and everything under it, so the difference between two lines is that layer's own
cost:

    eager                 f(x): two ATen launches
    ember                 the compiled function (wrapper -> cache hot path -> entry)
    entry                 the entry: guards, then the graph
    aot graph             the autograd layer: variant key, variant
    variant               InferenceVariant: grad mode off, compiled wrapper, outputs
    wrapper               the generated wrapper: shape check, allocation, launch
    site.run              the launch site's generated function (alignment check, C launcher)
    launch(tensors)       Triton's C launcher given the tensors (it calls data_ptr and
                          cuPointerGetAttribute per pointer)
    launch(addresses)     the C launcher given the addresses (what site.run passes: RAW_POINTERS)
    empty_strided         the wrapper's output allocation alone
    stream(device)        the current stream's handle, read at each launch

and ``ember RAW_POINTERS=False`` (the whole call passing tensors to the launcher), so the two
settings compare in one process. Median of 7 loops of N calls (CPU time per call, the device
synchronized at each loop's end), in microseconds.

    python benchmarks/probes/launch_breakdown.py [--iters N] [out.json]
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

GPU = torch.cuda.is_available()
if not GPU:  # a dry run of the script: the interpreter runs the first call, stand-ins the launches
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["EMBER_NATIVE_FORCE_TRITON"] = "1"

import ember  # noqa: E402
from ember.native import runtime  # noqa: E402
from ember.native.cache import load_module  # noqa: E402

DEV = "cuda" if GPU else "cpu"


class _Launcher:  # (CPU only) Triton 3.6's launcher object, its C launch a C no-op
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, False
    launch = "".format


class _Kernel:
    function, packed_metadata = 0, (1, 1, 0)
    run = _Launcher()


class _Driver:
    get_current_device = staticmethod(int)
    get_current_stream = staticmethod(int)


def _stub() -> None:
    from triton.runtime import driver
    driver.set_active(_Driver())

    def first_locked(self, args):
        self._slow(args)
        checks = tuple((i, (a.data_ptr() & 15) == 0) for i, a in enumerate(args)
                       if hasattr(a, "data_ptr") and i not in self.fresh)
        self.adopt(_Kernel(), checks, len(args))
    runtime.Launch._first_locked = first_locked


def timed(fn, n: int) -> float:
    sync = torch.cuda.synchronize if GPU else (lambda: None)
    for _ in range(min(n, 500)):
        fn()
    sync()
    per = []
    for _ in range(7):
        c = time.thread_time_ns()
        for _ in range(n):
            fn()
        sync()
        per.append((time.thread_time_ns() - c) / n / 1e3)
    return round(statistics.median(per), 3)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--iters")]
    n = next((int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--iters=")), 5000)
    if not GPU:
        _stub()
    torch.manual_seed(0)
    x = torch.randn(16, device=DEV)

    def f(x):
        return x * 2 + 1
    cf = ember.compile(f)
    torch.testing.assert_close(cf(x), f(x))  # (the first call; on CPU later ones launch nothing)
    if GPU:
        for _ in range(3):
            torch.testing.assert_close(cf(x), f(x))
    entry = cf._ember_cache.entries[0].fn
    graph = cf._ember_cache.entries[0].namespace["__graph"]
    (variant,) = graph.variants.values()
    wrapper = variant.compiled
    mod = load_module(wrapper.ember_native["wrapper"])
    (site,) = [v for v in vars(mod).values() if isinstance(v, runtime.Launch)]
    buf = torch.empty_like(x)
    launch, g0, g1, g2, stream, device, function, extra, checks, consts = site.fast
    rows = {
        "eager": lambda: f(x),
        "ember": lambda: cf(x),
        "entry": lambda: entry(x),
        "aot graph": lambda: graph(x),
        "variant": lambda: variant(x),
        "wrapper": lambda: wrapper(x),
        "site.run": lambda: site.run(x, buf, 16),
        "launch(tensors)": lambda: launch(g0, g1, g2, stream(device), function, *extra, x, buf, 16, *consts),
        "launch(addresses)": lambda: launch(g0, g1, g2, stream(device), function, *extra, x.data_ptr(),
                                            buf.data_ptr(), 16, *consts),
        "empty_strided": lambda: torch.empty_strided((16,), (1,), device=x.device, dtype=torch.float32),
        "stream(device)": lambda: stream(device),
    }
    out = {"device": torch.cuda.get_device_name() if GPU else "cpu (stand-in launches)",
           "python": sys.version.split()[0], "torch": torch.__version__, "iters": n,
           "us_per_call": {k: timed(fn, n) for k, fn in rows.items()}}
    runtime.RAW_POINTERS = False
    site.fast = site.fast  # (regenerates site.run for the setting)
    out["us_per_call"]["ember RAW_POINTERS=False"] = timed(lambda: cf(x), n)
    runtime.RAW_POINTERS = True
    site.fast = site.fast
    out["us_per_call"]["ember (again)"] = timed(lambda: cf(x), n)
    out["site_run_source"] = site.fast_source
    out["launch_stats"] = dict(runtime.STATS)
    text = json.dumps(out, indent=1)
    if args:
        with open(args[0], "w") as fh:
            fh.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
