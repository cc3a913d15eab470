"""``ember bench``: time a set of workloads eager, through ember and, on request, through torch.compile.

    ember bench                                  # the quick CPU suite (the GPU suite where CUDA is present)
    ember bench --workloads mlp,gpt2 --iters 50
    ember bench --backends ember,aot_eager --json out.json --plot out.png
    ember bench --with-torch-compile             # from a source checkout: runs benchmarks/bench_peer.py

The workloads are in ``ember.bench.workloads``; timing and checks in ``ember.bench.measure``.
This module only declares the command line, so ``ember --help`` stays fast.
"""
from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=["quick", "gpu"], default=None,
                   help="workload set (default: gpu where CUDA is available, else quick)")
    p.add_argument("--workloads", default=None, help="comma list of workloads of the suite (default: all)")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--backends", default="ember", help="comma list of ember backends to time (default: ember)")
    p.add_argument("--with-torch-compile", action="store_true",
                   help="add torch.compile as the peer, via benchmarks/bench_peer.py of a source checkout")
    p.add_argument("--peer-script", default=None, help="path to bench_peer.py (default: found next to ember)")
    p.add_argument("--peer-backend", default="inductor", help="torch.compile backend for the peer (default inductor)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default 0: torch's default)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before timing (default 3)")
    p.add_argument("--iters", type=int, default=20, help="timed calls; the median is reported (default 20)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    p.add_argument("--plot", default=None, metavar="PATH", help="draw speedups and compile times (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def main(opts: argparse.Namespace) -> int:
    import sys

    from ember.bench import report as rep
    from ember.bench.runner import BenchError, run

    if opts.plot:
        try:
            import matplotlib  # noqa: F401  (fail before spending minutes on the run)
        except ImportError:
            print("ember bench: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    try:
        result = run(opts)
    except BenchError as exc:
        print(f"ember bench: {exc}", file=sys.stderr)
        return 2
    print(rep.table(result))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"wrote {opts.json}")
    if opts.plot:
        rep.plot(result, opts.plot)
        print(f"wrote {opts.plot}")
    # ember's own failures fail the command; a peer failure is the peer's and is only reported
    bad = [r for r in result["results"] if r["variant"].startswith("ember") and r["status"] in ("mismatch", "error")]
    return 1 if bad else 0
