"""Probe (issue 25, CPU encoder row): eager vs ember with and without the session-37 rewrites, in one
process, calls interleaved in random order, each timed in wall time and CPU time (1 thread: this
thread's, CLOCK_THREAD_CPUTIME_ID, which leaves out the time other jobs hold the core; more threads:
the process's, OpenMP spin-waits included).

Variants: ``base`` (no oneDNN epilogue for Linear + ReLU, no ``cpu_mm.unpermute_rows``), ``onednn``
(the oneDNN packed linear only), ``new`` (both, the default).

    PYTHONPATH=. python benchmarks/probes/encoder_ab.py            # T=1 N=120
    T=2 N=200 PYTHONPATH=. python benchmarks/probes/encoder_ab.py
"""
import contextlib
import os
import random
import time
from unittest import mock

import torch

T = int(os.environ.get("T", "1"))
torch.set_num_threads(T)
import ember  # noqa: E402
from ember.native import cpu_mm, packed_linear  # noqa: E402


@contextlib.contextmanager
def base():
    with mock.patch.object(packed_linear, "ONEDNN_OPS", {}), mock.patch.object(cpu_mm, "unpermute_rows", lambda gm: 0):
        yield


@contextlib.contextmanager
def onednn():
    with mock.patch.object(cpu_mm, "unpermute_rows", lambda gm: 0):
        yield


VARIANTS = {"base": base, "onednn": onednn, "new": contextlib.nullcontext}


def model():
    torch.manual_seed(0)  # (the cpu_suite row: d256, 8 heads, ff 1024, b16 x s128)
    return torch.nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True).eval()


def q(xs, p):
    return sorted(xs)[int(len(xs) * p)]


def main():
    x = torch.randn(16, 128, 256)
    steps = {"eager": model()}
    with torch.no_grad():
        ref = steps["eager"](x)
        for name, ctx in VARIANTS.items():
            with ctx():  # (the rewrites happen at the first call; the disk cache is off so each variant compiles)
                cm = ember.compile(model(), options={"force_disable_caches": True})
                err = ((cm(x) - ref).abs().max() / ref.abs().max()).item()
            print(f"{name}: rel err {err:.2e}", flush=True)
            steps[name] = cm
        for f in steps.values():
            for _ in range(5):
                f(x)
        tc = time.thread_time_ns if T == 1 else time.process_time_ns
        cpu, wall = ({n: [] for n in steps} for _ in range(2))
        order = list(steps)
        for _ in range(int(os.environ.get("N", "120"))):
            random.shuffle(order)
            for n in order:
                w, c = time.perf_counter_ns(), tc()
                steps[n](x)
                cpu[n].append((tc() - c) / 1e3)
                wall[n].append((time.perf_counter_ns() - w) / 1e3)
    print(f"threads {T}, {len(cpu['eager'])} calls each (us; speedup = eager / variant)")
    for n in steps:
        print(f"{n:7s} cpu p50 {q(cpu[n], .5):8.0f} p10 {q(cpu[n], .1):8.0f} | wall p50 {q(wall[n], .5):8.0f} "
              f"p10 {q(wall[n], .1):8.0f} | speedup cpu p50 {q(cpu['eager'], .5) / q(cpu[n], .5):.3f} "
              f"p10 {q(cpu['eager'], .1) / q(cpu[n], .1):.3f}, wall p50 {q(wall['eager'], .5) / q(wall[n], .5):.3f} "
              f"p10 {q(wall['eager'], .1) / q(wall[n], .1):.3f}")


if __name__ == "__main__":
    main()
