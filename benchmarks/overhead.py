"""Per-call overhead of a cache hit: ember vs eager vs torch.compile.

    python benchmarks/overhead.py            # full run, ~2-4 minutes on CPU (inductor compiles dominate)
    python benchmarks/overhead.py --quick    # fewer iterations and repeats

Workloads:
  tiny   `lambda x: x + 1` on a 16-element tensor: almost pure dispatch, so the time is overhead.
  mlp12  nn.Sequential of 12 x (Linear(64, 64), ReLU), batch 8: many small modules in one frame.

Variants: eager; ember.compile with backend="eager" and with the default backend; torch.compile
with backend="eager" (the peer's own capture/guard overhead) and its default (inductor).

Method: each (workload, variant) runs in its own process so that no cache, guard or dispatch
state leaks between variants. The first call (the compile) is timed alone; then warm-up calls;
then R repeats of N back-to-back calls timed with perf_counter_ns (on CUDA, synchronised at the
end of each repeat); the result is the median over repeats of the mean time per call, in µs
("best" is the minimum over repeats). On CPU torch runs one intra-op thread by default (--threads):
on a small shared machine, thread contention otherwise swamps the overhead being measured.
A variant that fails (e.g. no C++ compiler for inductor) is reported as skipped.

Writes benchmarks/results/overhead-<device>.json.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import types

WORKLOADS = ("tiny", "mlp12")
VARIANTS = ("eager", "ember:eager", "ember", "torch.compile:eager", "torch.compile")
# (iterations per repeat, repeats): full, quick
ITERS = {"tiny": ((5000, 9), (500, 5)), "mlp12": ((500, 9), (100, 5))}
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing


def _fresh(fn):
    """A copy of `fn` with its own code object, so no compile cache is shared with other copies."""
    code = fn.__code__.replace()
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def build(workload: str, device: str):
    import torch

    torch.manual_seed(0)
    if workload == "tiny":
        return _fresh(lambda x: x + 1), torch.randn(16, device=device)
    if workload == "mlp12":
        layers = []
        for _ in range(12):
            layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers).to(device).eval(), torch.randn(8, 64, device=device)
    raise SystemExit(f"unknown workload {workload}")


def wrap(variant: str, fn):
    import torch

    if variant == "eager":
        return fn
    if variant.startswith("ember"):
        import ember

        backend = variant.partition(":")[2]
        return ember.compile(fn, backend=backend) if backend else ember.compile(fn)
    if variant.startswith("torch.compile"):
        import torch._dynamo  # benchmarks may drive the peer directly

        torch._dynamo.reset()
        backend = variant.partition(":")[2]
        return torch.compile(fn, backend=backend) if backend else torch.compile(fn)
    raise SystemExit(f"unknown variant {variant}")


def measure(workload: str, variant: str, device: str, quick: bool, threads: int) -> dict:
    """Time one variant in this process; returns one result record."""
    import torch

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    iters, repeats = ITERS[workload][1 if quick else 0]
    if threads:
        torch.set_num_threads(threads)
    fn, x = build(workload, device)
    with torch.no_grad():
        ref = (copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn)(x)
        step = wrap(variant, fn)
        t0 = time.perf_counter()
        out = step(x)
        sync()
        first = time.perf_counter() - t0
        for _ in range(max(20, iters // 10)):
            step(x)
        sync()
        per_call_us = []
        for _ in range(repeats):
            t = time.perf_counter_ns()
            for _ in range(iters):
                step(x)
            sync()
            per_call_us.append((time.perf_counter_ns() - t) / iters / 1e3)
    return dict(workload=workload, variant=variant, status="ok",
                us_per_call=round(statistics.median(per_call_us), 3),
                us_per_call_min=round(min(per_call_us), 3),
                us_per_call_repeats=[round(v, 3) for v in per_call_us],
                first_call_s=round(first, 4), iters=iters, repeats=repeats,
                max_abs_err=(out.float() - ref.float()).abs().max().item())


def run_isolated(workload: str, variant: str, device: str, quick: bool, threads: int,
                 timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", workload, variant, "--device", device,
           "--threads", str(threads)]
    if quick:
        cmd.append("--quick")
    base = dict(workload=workload, variant=variant)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(base, status="skipped", error=f"timed out after {timeout:.0f} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(base, status="skipped", error=f"exit {proc.returncode}: {tail[:300]}")


def device_label(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
        return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return "cpu"


def print_table(results: list[dict]) -> None:
    eager = {r["workload"]: r.get("us_per_call") for r in results if r["variant"] == "eager"}
    print(f"\n{'workload':<8} {'variant':<20} {'us/call':>10} {'best':>10} {'+us vs eager':>13}"
          f" {'first call s':>13}  note")
    for r in results:
        if r["status"] != "ok":
            print(f"{r['workload']:<8} {r['variant']:<20} {'-':>10} {'-':>10} {'-':>13} {'-':>13}"
                  f"  skipped: {r['error']}")
            continue
        base = eager.get(r["workload"])
        delta = f"{r['us_per_call'] - base:+.2f}" if base is not None else "-"
        note = f"max abs err {r['max_abs_err']:.2g}" if r["max_abs_err"] else ""
        print(f"{r['workload']:<8} {r['variant']:<20} {r['us_per_call']:>10.2f} {r['us_per_call_min']:>10.2f}"
              f" {delta:>13}"
              f" {r['first_call_s']:>13.3f}  {note}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations and repeats")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: 1 on CPU, so the time is overhead, not "
                        "thread contention; 0 keeps torch's default)")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per variant process")
    p.add_argument("--out", default=None, help="JSON path (default results/overhead-<device>.json; with --quick "
                                               "results/quick/overhead-<device>.json, gitignored)")
    p.add_argument("--one", nargs=2, metavar=("WORKLOAD", "VARIANT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    threads = args.threads if args.threads is not None else (0 if device.startswith("cuda") else 1)
    if args.one:
        print(json.dumps(measure(*args.one, device, args.quick, threads)), flush=True)
        return 0

    results = []
    for wl in args.workloads.split(","):
        for var in args.variants.split(","):
            print(f"running {wl} / {var} ...", flush=True)
            results.append(run_isolated(wl, var, device, args.quick, threads, args.timeout))
    print_table(results)

    try:
        import ember
        ember_version = getattr(ember, "__version__", "unknown")
    except Exception as exc:
        ember_version = f"import failed: {type(exc).__name__}"
    label = device_label(device)
    report = dict(benchmark="overhead", date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  device=label, python=platform.python_version(), torch=torch.__version__,
                  ember=ember_version, platform=platform.platform(), cpu_count=os.cpu_count(),
                  torch_threads=threads or torch.get_num_threads(), quick=args.quick,
                  method="own process per variant; median over repeats of mean us per call "
                         "(perf_counter_ns; CUDA synchronised per repeat)",
                  results=results)
    # a --quick run is a smoke test, never the committed numbers: it goes to the gitignored quick/ folder
    out = args.out or os.path.join(HERE, "results", *(["quick"] if args.quick else []), f"overhead-{label}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"\nwrote {os.path.relpath(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
