"""Cold compile time of a small transformer of N identical blocks, regional compilation on/off (CPU).

    python benchmarks/regional_compile.py --layers 12 --backend ember [--off] [--train]

One fresh process per row (the shared compile caches are per process; the on-disk AOT cache is
turned off so every row traces). Prints the time from the first call to its result (imports excluded), wall and this process's CPU
time (the CPU time is the steadier number on a shared machine).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["EMBER_AOT_CACHE"] = "0"
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "regional"))
import ember  # noqa: E402
from models import Tiny  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--backend", default="ember")
    ap.add_argument("--off", action="store_true", help="regional compilation off")
    ap.add_argument("--train", action="store_true", help="time forward+backward")
    ap.add_argument("--steady", type=int, default=5, help="calls timed after the first")
    a = ap.parse_args()
    torch.manual_seed(0)
    m = Tiny(a.layers, dim=64)
    idx = torch.randint(0, 64, (4, 32))
    c = ember.compile(m, backend=a.backend, options={"regional": not a.off})
    t0, c0 = time.perf_counter(), time.process_time()
    out = c(idx)
    if a.train:
        out.sum().backward()
    cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()
    for _ in range(a.steady):
        out = c(idx)
        if a.train:
            out.sum().backward()
    steady = (time.perf_counter() - t0) / a.steady
    print(f"layers={a.layers} backend={a.backend} regional={'off' if a.off else 'on'} "
          f"{'train' if a.train else 'infer'} cold={cold:.3f}s cold_cpu={cold_cpu:.3f}s steady={steady * 1e3:.2f}ms")


if __name__ == "__main__":
    main()
