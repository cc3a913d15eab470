"""A loop with a graph break in every iteration: ember vs eager vs torch.compile.

    python benchmarks/loops.py                 # CPU here; CUDA when available (or --device)
    python benchmarks/loops.py --quick         # fewer repeats (writes results/loops-<machine>-quick.json)

Workload ("train_like"): 100 iterations of ~20 tensor ops on a (64, 64) state, with a ``.item()`` and
a ``print`` of it in every iteration (a training loop that logs its loss). torch.compile (dynamo)
skips such a frame; ember runs the loop as Python and compiles the body's straight-line code
between the breaks (docs/graph-breaks.md).

Variants: eager; ember.compile (backend "eager": the captured graphs run as they are; and the
default "ember" backend); torch.compile (backend "eager" and its default, inductor). Each runs in its
own process. Per variant: the first call (compile included), then R repeats of one full call (100
iterations), median and best wall time; the result and the printed text are compared with eager's;
for ember, ``ember.explain`` counts the graphs that ran in each iteration.

Writes benchmarks/results/loops-<machine>.json (machine: the GPU's name, or "cpu-<cpu model>").
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

VARIANTS = ("eager", "ember:eager", "ember", "torch.compile:eager", "torch.compile")
ITERATIONS = 100


def train_like(x, w1, w2, steps):
    """~20 tensor ops per iteration around a .item() and a print."""
    h = x
    for step in range(steps):
        z = h @ w1
        z = z * 0.5 + 0.1
        z = torch.tanh(z)
        z = z @ w2
        z = z - z.mean(dim=-1, keepdim=True)
        z = z / (z.std(dim=-1, keepdim=True) + 1e-5)
        z = torch.relu(z) + 0.01 * z
        loss = (z * z).mean()
        value = loss.item()                        # break: the tensor's value
        print(f"step {step:3d} loss {value:.6f}")  # break: a print
        h = h * 0.9 + 0.1 * z
        h = h.clamp(-3.0, 3.0)
        h = h + torch.sin(h) * 0.01
        h = h / (h.norm() + 1.0) * 8.0
    return h


import torch  # noqa: E402 - after the docstring-level definitions, used by train_like's globals


def _fresh(fn):
    """A copy of ``fn`` with its own code object: no compile cache shared with other variants."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def inputs(device: str):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g).to(device)
    w1 = (torch.randn(64, 64, generator=g) / 8).to(device)
    w2 = (torch.randn(64, 64, generator=g) / 8).to(device)
    return x, w1, w2, ITERATIONS


def wrap(variant: str, fn):
    if variant == "eager":
        return fn
    backend = variant.partition(":")[2]
    if variant.startswith("ember"):
        import ember

        return ember.compile(fn, backend=backend) if backend else ember.compile(fn)
    import torch._dynamo  # the peer, driven directly by a benchmark

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend) if backend else torch.compile(fn)


def _call(fn, args, device):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = fn(*args)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return result, out.getvalue()


def measure(variant: str, device: str, repeats: int, threads: int) -> dict:
    if threads:
        torch.set_num_threads(threads)
    args = inputs(device)
    want, want_text = _call(train_like, args, device)
    fn = wrap(variant, _fresh(train_like))
    t0 = time.perf_counter()
    got, text = _call(fn, args, device)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        got, text = _call(fn, args, device)
        times.append(time.perf_counter() - t)
    # the printed losses, number by number: a backend with other rounding may differ in the last digit
    nums = [(float(a), float(b)) for a, b in zip(re.findall(r"-?\d+\.\d+", text), re.findall(r"-?\d+\.\d+", want_text))]
    record = dict(variant=variant, status="ok", first_call_s=round(first, 4),
                  ms_per_call=round(statistics.median(times) * 1e3, 3), ms_per_call_best=round(min(times) * 1e3, 3),
                  ms_per_iteration=round(statistics.median(times) * 1e3 / ITERATIONS, 4), repeats=repeats,
                  max_abs_err=float((got - want).abs().max()), printed_text_equal=text == want_text,
                  printed_lines=len(text.splitlines()), printed_lines_expected=len(want_text.splitlines()),
                  printed_max_abs_diff=max((abs(a - b) for a, b in nums), default=0.0))
    if variant.startswith("torch.compile"):
        from torch._dynamo.utils import counters  # the peer's own count of the graphs it captured

        record.update(graphs_compiled=int(counters["stats"]["unique_graphs"]))
    if variant.startswith("torch.compile"):
        from torch._dynamo.utils import counters  # the peer's own count of the graphs it captured

        record.update(graphs_compiled=int(counters["stats"]["unique_graphs"]))
    if variant.startswith("ember"):
        import ember

        backend = variant.partition(":")[2] or "ember"
        with contextlib.redirect_stdout(io.StringIO()):
            report = ember.explain(_fresh(train_like), backend=backend)(*args)
        in_loop = [report.graphs[n - 1] for numbers in report.loops.values() for n in numbers]
        record.update(graphs_compiled=report.graph_count,
                      graph_calls_per_iteration=round(sum(g.calls for g in in_loop) / ITERATIONS, 2),
                      graph_ops_per_iteration=round(sum(g.calls * g.op_count for g in in_loop) / ITERATIONS, 2),
                      loops=list(report.loops))
    return record


def run_isolated(variant: str, device: str, repeats: int, threads: int, timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", variant, "--device", device,
           "--repeats", str(repeats), "--threads", str(threads)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(variant=variant, status="skipped", error=f"timed out after {timeout:.0f} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(variant=variant, status="skipped", error=f"exit {proc.returncode}: {tail[:300]}")


def machine_label(device: str) -> str:
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = platform.processor() or platform.machine()
        with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
        name = f"cpu-{name}"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 repeats instead of 15")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: 1 on CPU)")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed per variant process")
    p.add_argument("--out", default=None, help="JSON path (default results/loops-<machine>.json)")
    p.add_argument("--one", metavar="VARIANT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    threads = args.threads if args.threads is not None else (0 if device.startswith("cuda") else 1)
    repeats = args.repeats or (3 if args.quick else 15)
    if args.one:
        print(json.dumps(measure(args.one, device, repeats, threads)), flush=True)
        return 0
    results = []
    for variant in args.variants.split(","):
        print(f"running {variant} ...", flush=True)
        results.append(run_isolated(variant, device, repeats, threads, args.timeout))
    eager = next((r["ms_per_call"] for r in results if r["variant"] == "eager" and r["status"] == "ok"), None)
    print(f"\n{'variant':<22} {'ms/call':>9} {'best':>9} {'vs eager':>9} {'first s':>8} {'graphs':>6} {'graphs/iter':>11}  check")
    for r in results:
        if r["status"] != "ok":
            print(f"{r['variant']:<22} skipped: {r['error']}")
            continue
        ratio = f"{eager / r['ms_per_call']:.2f}x" if eager else "-"
        same_text = r["printed_text_equal"] or (r["printed_lines"] == r["printed_lines_expected"]
                                                and r["printed_max_abs_diff"] <= 2e-6)  # last printed digit
        ok = ("equal" if r["printed_text_equal"] else "equal (last printed digit)") \
            if same_text and r["max_abs_err"] < 1e-4 else f"DIFFERS (err {r['max_abs_err']:.2g})"
        print(f"{r['variant']:<22} {r['ms_per_call']:>9.2f} {r['ms_per_call_best']:>9.2f} {ratio:>9} "
              f"{r['first_call_s']:>8.2f} {r.get('graphs_compiled', '-'):>6} {r.get('graph_calls_per_iteration', '-'):>11}  {ok}")
    label = machine_label(device)
    out = args.out or os.path.join(HERE, "results", f"loops-{label}{'-quick' if args.quick else ''}.json")
    report = dict(benchmark="loops", date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  machine=label, device=device, threads=threads, iterations=ITERATIONS, repeats=repeats,
                  python=platform.python_version(), torch=torch.__version__, platform=platform.platform(),
                  workload="train_like: 100 x (~20 tensor ops on a 64x64 state, .item(), print)", results=results)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
