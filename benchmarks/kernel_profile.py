"""Kernel-time breakdown of one gpu_suite workload under one compiler (CUDA only).

    python benchmarks/kernel_profile.py gpt2_infer ember        # or eager, torch
    python benchmarks/kernel_profile.py bert_infer torch --top 30

Builds the workload as ``gpu_suite.py`` does, compiles it, warms up, then profiles 3 calls with
``torch.profiler`` and prints the total device time per call, the number of kernels per call and the
most expensive kernels (time per call, launches per call, name), after the CPU-side time per call
(issuing 20 calls) and the wall time per call. Complements the suite's wall-clock numbers: a
workload whose kernel time is well under its ms/call is bound by CPU-side overhead. Under ember, it
ends with the process's automatic CUDA-graph decisions (replayed or not, why, measured times).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload")
    p.add_argument("compiler", choices=("eager", "ember", "torch"))
    p.add_argument("--mode", default="default")
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    import gpu_suite as gs
    if not torch.cuda.is_available():
        raise SystemExit("kernel_profile needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    build, inputs, _ = gs.make(args.workload, "cuda", False)
    step = build(gs.compiler_fn(args.compiler, args.mode))
    t0 = time.perf_counter()
    step(*inputs)
    torch.cuda.synchronize()
    print(f"{args.workload} {args.compiler}: first call {time.perf_counter() - t0:.2f} s")
    # (ember in default mode times a graph's calls 2-4 to decide whether it replays as a CUDA graph,
    # then records it at the next two: 10 calls leave every graph in its steady state)
    for _ in range(10):
        step(*inputs)
    torch.cuda.synchronize()
    # CPU side: the time to issue the calls (no sync inside the loop) against the wall time to
    # finish them; equal figures mean the GPU waits for the CPU
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        step(*inputs)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"cpu-side {(t1 - t0) / n * 1e3:.3f} ms per call, wall {(t2 - t0) / n * 1e3:.3f} ms per call ({n} calls)")
    calls = 3
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step(*inputs)
        torch.cuda.synchronize()
    rows = sorted((k for k in prof.key_averages() if k.device_type.name == "CUDA" and k.device_time_total > 0),
                  key=lambda k: -k.device_time_total)
    total = sum(k.device_time_total for k in rows) / calls / 1e3
    print(f"device time per call {total:.3f} ms, {sum(k.count for k in rows) / calls:.0f} kernels per call")
    for k in rows[:args.top]:
        print(f"  {k.device_time_total / calls / 1e3:8.3f} ms  x{k.count // calls:4d}  {k.key[:110]}")
    if args.compiler == "ember":
        print_cudagraph_decisions()
    return 0


def print_cudagraph_decisions() -> None:
    """ember's automatic CUDA-graph decisions of this process (``ember.cudagraphs.auto.DECISIONS``: a
    graph decided by timing its first calls says "measured", with its host and device times) and
    the replay counters."""
    import ember.cudagraphs as cg
    from ember.cudagraphs import auto
    print(f"cuda graphs: {len(auto.DECISIONS)} decision(s)")
    for name, replay, why in auto.DECISIONS:
        print(f"  {name}: {'replays' if replay else 'runs as compiled'}: {why}")
    s = cg.stats()
    print(f"  warm-ups {s['warmups']}, recordings {s['recordings']}, replays {s['replays']}, "
          f"fallbacks {s['fallbacks']}, disabled {s['disabled'][:3]}")


if __name__ == "__main__":
    sys.exit(main())
