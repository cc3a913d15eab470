"""What gpu_suite.py measures beside time: FLOPs of a step, the device's measured peaks, memory.

* ``count_flops(step, inputs)``: FLOPs of one call, counted by ``torch.utils.flop_counter.FlopCounterMode``
  on the eager step (matmuls, convolutions, attention, forward and backward; pointwise ops count 0);
* ``device_peaks(dev)``: what this device really does, measured in the same run: copy bandwidth
  (``y.copy_(x)`` of 1 GiB, read + write counted) and dense bf16 matmul throughput (8192^3, TF32 off);
* ``achieved(row, peaks)``: TFLOP/s and % of the matmul peak for compute-bound rows, GB/s and % of the
  copy bandwidth for rows that declare their bytes (memory-bound: ln_gelu, softmax).
"""
from __future__ import annotations

import statistics


def count_flops(step, inputs) -> int | None:
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    with FlopCounterMode(display=False) as fc:
        step(*inputs)
    return int(fc.get_total_flops())


def loop_times(fn, iters: int, loops: int, cuda: bool) -> list:
    """ms per call of ``fn`` in each of ``loops`` loops of ``iters`` calls: CUDA events around each
    loop on a GPU (CPU-side overhead counts, as it does for users), wall time on a CPU."""
    import time

    import torch
    times = []
    for _ in range(loops):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / iters)
        else:
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            times.append((time.perf_counter() - t) * 1e3 / iters)
    return times


def _time_ms(fn, iters: int, cuda: bool) -> float:
    for _ in range(3):
        fn()
    return statistics.median(loop_times(fn, iters, 5, cuda))


def device_peaks(dev: str, quick: bool = False) -> dict:
    """{copy_GBps, bf16_mm_TFLOPs} measured on ``dev`` now."""
    import torch
    cuda = dev.startswith("cuda")
    n = (1 << 20) if quick else (1 << 29)  # bf16 elements: 2 MiB / 1 GiB
    x = torch.randn(n, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = _time_ms(lambda: y.copy_(x), 5 if quick else 20, cuda)
    copy = 2 * n * 2 / (ms * 1e-3) / 1e9
    del x, y
    s = 256 if quick else 8192
    a = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
    b = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
    ms = _time_ms(lambda: a @ b, 3 if quick else 20, cuda)
    mm = 2 * s ** 3 / (ms * 1e-3) / 1e12
    return dict(copy_GBps=round(copy, 1), bf16_mm_TFLOPs=round(mm, 1), copy_bytes=2 * n * 2, mm_size=s,
                device=torch.cuda.get_device_name() if cuda else "cpu")


def achieved(row: dict, peaks: dict | None, compilers=("eager", "ember", "torch")) -> None:
    """Add per-compiler ``<c>_TFLOPs`` / ``<c>_pct_mm_peak`` (rows with a FLOP count) and
    ``<c>_pct_copy_peak`` (rows with bytes: memory-bound) to ``row``, in place."""
    flops = row.get("flops")
    for c in compilers:
        ms = row.get(f"{c}_ms")
        if not ms:
            continue
        if flops:
            tf = flops / (ms * 1e-3) / 1e12
            row[f"{c}_TFLOPs"] = round(tf, 2)
            if peaks and peaks.get("bf16_mm_TFLOPs"):
                row[f"{c}_pct_mm_peak"] = round(100 * tf / peaks["bf16_mm_TFLOPs"], 1)
        gbps = row.get(f"{c}_GBps")
        if gbps and peaks and peaks.get("copy_GBps"):
            row[f"{c}_pct_copy_peak"] = round(100 * gbps / peaks["copy_GBps"], 1)
