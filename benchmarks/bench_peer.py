"""The torch.compile column of `ember bench --with-torch-compile`.

ember's product code never calls torch.compile, so `ember bench` runs this script (a benchmark,
which may drive the peer) as a child process. It builds the same workloads (ember.bench.workloads),
checks torch.compile's output against eager, times eager and compiled in turns with the same
helper, and prints one `PEER {json}` line per workload. Run alone it works too:

    python benchmarks/bench_peer.py --suite quick --workloads mlp,pointwise
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # ember from this checkout


def measure(name: str, opts) -> dict:
    import torch
    import torch._dynamo

    from ember.bench import measure as m
    from ember.bench import workloads

    variant = "torch.compile" if opts.backend == "inductor" else f"torch.compile:{opts.backend}"
    rec = dict(workload=name, description=workloads.WORKLOADS[name].description, variant=variant)
    w = workloads.WORKLOADS[name]
    if w.needs:
        try:
            __import__(w.needs)
        except ImportError:
            return dict(rec, status="skipped", error=f"needs {w.needs}")
    dtype = getattr(torch, opts.dtype)
    rtol, atol = m.tolerance(opts.device, dtype)
    fn, args = workloads.build(w, opts.suite, opts.device, dtype)
    torch._dynamo.reset()
    with torch.no_grad():
        ref = fn(*args)
        try:
            compiled = torch.compile(fn, backend=opts.backend)
            out, rec["compile_s"] = m.first_call(lambda: compiled(*args), opts.device)
            rec["match"], rec["max_abs_err"], why = m.compare(ref, out, rtol, atol)
            rec.update(status="ok" if rec["match"] else "mismatch", error=why or None)
        except Exception as exc:
            return dict(rec, status="error", error=f"{type(exc).__name__}: {exc}"[:500])
        t = m.median_ms({"eager": lambda: fn(*args), "peer": lambda: compiled(*args)}, opts.device, opts.warmup,
                        opts.iters)
    return dict(rec, ms=t["peer"]["ms"], min_ms=t["peer"]["min_ms"], eager_ms=t["eager"]["ms"],
                speedup=t["eager"]["ms"] / t["peer"]["ms"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="quick")
    p.add_argument("--workloads", required=True, help="comma list")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--backend", default="inductor", help="torch.compile backend")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    opts = p.parse_args(argv)
    if opts.threads:
        import torch

        torch.set_num_threads(opts.threads)
    for name in opts.workloads.split(","):
        print("PEER " + json.dumps(measure(name, opts)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
