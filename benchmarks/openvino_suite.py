"""CPU inference: eager vs ember's openvino backend vs OpenVINO's own torch.compile integration.

    python benchmarks/openvino_suite.py             # full run (~10 minutes on 2 cores)
    python benchmarks/openvino_suite.py --quick     # one repeat, shorter timing windows
    python benchmarks/openvino_suite.py --models convnet6 --batches 1

Models (inference, eval mode, fp32 inputs):
  convnet6       6 x (Conv3x3 no bias + BatchNorm + ReLU), 32-64-64-128-128-256 channels, strides 1,2,1,2,1,2,
                 avgpool + Linear; input 3x96x96 (the model of docs' research brief)
  resnet18       torchvision-style ResNet-18 (BasicBlocks 2-2-2-2), input 3x64x64
  encoder_layer  nn.TransformerEncoderLayer(256, 8 heads, ff 1024, dropout 0, batch_first), sequence 128
  bert_small     Hugging Face BertModel, 4 layers, hidden 256, 4 heads, sequence 64 (built from a config)
at batch 1 and 16.

Variants:
  eager            the model as is
  ember            ember.compile(model, backend="openvino"), default options
  ov_torch         torch.compile(model, backend="openvino") after `import openvino.torch`
  ov_torch_aot     the same with options={"aot_autograd": True}
A variant that fails is recorded with its error instead of a time.

Method: every (model, batch, variant) runs in its own process (eager processes never import openvino,
so no thread pool of one runtime disturbs the other). In a process: build, time the first call
(compile + run), 5 warm-up calls, then back-to-back calls until at least 30 calls and 2 seconds; the
process reports the median (and the CPU time per call). The whole grid is repeated (--repeats, default 3; the repeats are
interleaved so that load from other processes hits every variant alike) and the table shows the median
of the repeats' medians. Torch uses its default thread count; OpenVINO runs with the same number
(ember sets it, OpenVINO's own integration uses all cores, the same number here). Max relative error
vs eager is measured on one call after timing.

Model caching: convnet6 at batch 1 is also compiled with model_caching=True twice in fresh processes
sharing one new cache directory, to compare the first call's latency cold vs warm.

Dynamic lengths: encoder_layer at batch 1 over 8 sequence lengths (16..128), one process per variant:
eager, ember (default dynamic=None: static first, then one dynamic compile), ember_static
(dynamic=False: one compile per length) and OpenVINO's torch.compile with aot_autograd. Reported: the
first pass over the lengths (compiles included), the median call of later passes, and ember's frontend
compile count. `--dynamic-only` runs just this row (written to openvino-dynamic-cpu.json).

Writes benchmarks/results/openvino-cpu.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Run as a script, this file's folder leads sys.path, and this file would shadow the openvino package.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
MODELS = ("convnet6", "resnet18", "encoder_layer", "bert_small")
VARIANTS = ("eager", "ember", "ov_torch", "ov_torch_aot")
DYNAMIC_VARIANTS = ("eager", "ember", "ember_static", "ov_torch_aot")
LENGTHS = (16, 24, 40, 56, 72, 96, 112, 128)


# ------------------------------------------------------------------------------------------ models

def build_model(name: str, batch: int):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    if name == "convnet6":
        chans, strides, layers = [3, 32, 64, 64, 128, 128, 256], [1, 2, 1, 2, 1, 2], []
        for k in range(6):
            layers += [nn.Conv2d(chans[k], chans[k + 1], 3, strides[k], 1, bias=False), nn.BatchNorm2d(chans[k + 1]),
                       nn.ReLU()]
        model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))
        return _eval(model), (torch.randn(batch, 3, 96, 96),)
    if name == "resnet18":
        return _eval(_resnet18()), (torch.randn(batch, 3, 64, 64),)
    if name == "encoder_layer":
        model = nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True)
        return _eval(model), (torch.randn(batch, 128, 256),)
    if name == "bert_small":
        import transformers
        config = transformers.BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                         intermediate_size=1024, vocab_size=8000, max_position_embeddings=128)
        return _eval(transformers.BertModel(config)), (torch.randint(0, 8000, (batch, 64)),)
    raise ValueError(f"unknown model {name!r}; models: {', '.join(MODELS)}")


def _eval(model):
    import torch
    for m in model.modules():  # non-trivial batch-norm statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def _resnet18():
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + self.down(x))

    layers, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


# ------------------------------------------------------------------------------ one measurement

def compile_variant(variant: str, model, threads: int | None):
    """The model compiled as ``variant``. With ``threads`` set, torch runs that many threads and so does
    OpenVINO (ember follows torch's count by itself; OpenVINO's integration is told in its config)."""
    import torch
    if threads:
        torch.set_num_threads(threads)
    if variant == "eager":
        return model
    if variant in ("ember", "ember_static"):
        sys.path.insert(0, ROOT)
        import ember
        return ember.compile(model, backend="openvino", dynamic=False if variant == "ember_static" else None)
    import openvino.torch  # noqa: F401  (registers OpenVINO's own torch.compile backend)
    opts = {"aot_autograd": True} if variant == "ov_torch_aot" else {}
    if threads:
        opts["config"] = {"INFERENCE_NUM_THREADS": threads}
    return torch.compile(model, backend="openvino", options=opts or None)


def _main_tensor(out):
    for attr in ("last_hidden_state", "logits"):
        if hasattr(out, attr):
            return getattr(out, attr)
    return out[0] if isinstance(out, (tuple, list)) else out


def measure_one(model_name: str, batch: int, variant: str, threads: int | None, min_s: float, min_runs: int) -> dict:
    import torch
    model, inputs = build_model(model_name, batch)
    result = {"model": model_name, "batch": batch, "variant": variant}
    with torch.no_grad():
        compiled = compile_variant(variant, model, threads)
        result["torch_threads"] = torch.get_num_threads()
        t0 = time.perf_counter()
        out = compiled(*inputs)
        result["first_call_s"] = round(time.perf_counter() - t0, 4)
        for _ in range(5):
            compiled(*inputs)
        times, start, cpu_start = [], time.perf_counter(), time.process_time()
        while len(times) < min_runs or time.perf_counter() - start < min_s:
            t = time.perf_counter()
            compiled(*inputs)
            times.append(time.perf_counter() - t)
            if len(times) >= 2000:
                break
        # CPU time of all the process's threads per call: with one thread it is the compute time,
        # unaffected by other processes taking turns on the cores (with more threads it sums them)
        result["cpu_ms"] = round((time.process_time() - cpu_start) / len(times) * 1e3, 4)
        result["ms"] = round(statistics.median(times) * 1e3, 4)
        result["load_1min"] = round(os.getloadavg()[0], 2)  # other processes on the machine
        result["runs"] = len(times)
        if variant != "eager":
            ref = _main_tensor(model(*inputs)).double()
            got = _main_tensor(out).double()
            result["max_rel_err"] = float((got - ref).abs().max() / ref.abs().max())
    return result


def measure_cache(cache_dir: str) -> dict:
    """First-call latency with model caching, and how much of it the backend spent."""
    import torch
    sys.path.insert(0, ROOT)
    import ember
    import ember.backends.openvino.backend as ov_backend

    spent = []
    original = ov_backend.openvino_backend

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t)

    ov_backend.openvino_backend = timed
    model, inputs = build_model("convnet6", 1)
    compiled = ember.compile(model, backend="openvino", options={"model_caching": True, "cache_dir": cache_dir})
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(*inputs)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled(*inputs)
        second = time.perf_counter() - t0
    return {"first_call_s": round(first, 4), "backend_s": round(sum(spent), 4), "second_call_ms": round(second * 1e3, 3)}


def measure_dynamic(variant: str, threads: int | None) -> dict:
    """encoder_layer at batch 1 over LENGTHS: the first pass (compiles included), then later passes."""
    import torch
    model, _ = build_model("encoder_layer", 1)
    inputs = [torch.randn(1, n, 256) for n in LENGTHS]
    with torch.no_grad():
        compiled = compile_variant(variant, model, threads)
        t0 = time.perf_counter()
        for x in inputs:
            compiled(x)
        first_pass = time.perf_counter() - t0
        times = {n: [] for n in LENGTHS}
        for _ in range(10):
            for n, x in zip(LENGTHS, inputs):
                t = time.perf_counter()
                compiled(x)
                times[n].append(time.perf_counter() - t)
        err = max(float((compiled(x) - model(x)).abs().max() / model(x).abs().max()) for x in inputs)
    cache = getattr(compiled, "_ember_cache", None)
    return {"variant": variant, "first_pass_s": round(first_pass, 4),
            "ms": {n: round(statistics.median(t) * 1e3, 4) for n, t in times.items()},
            "frontend_compiles": cache.compile_count if cache is not None else None,
            "max_rel_err": err, "load_1min": round(os.getloadavg()[0], 2)}


def run_dynamic(threads: str) -> dict:
    results = {}
    for variant in DYNAMIC_VARIANTS:
        results[variant] = _child(["--dynamic-probe", variant, threads])
        res = results[variant]
        shown = f"first pass {res['first_pass_s']:.2f}s" if "first_pass_s" in res else f"FAILED: {res['error'][:100]}"
        print(f"dynamic lengths, threads={threads}, {variant}: {shown}", flush=True)
    return results


def print_dynamic(results: dict) -> None:
    print(f"\nencoder_layer b1 over sequence lengths {', '.join(map(str, LENGTHS))}:")
    print("| variant | first pass (compiles included) | median call, length 16 / 56 / 128 | frontend compiles |")
    print("|---|---|---|---|")
    for variant, r in results.items():
        if "first_pass_s" not in r:
            print(f"| {variant} | failed | | |")
            continue
        ms = r["ms"]
        calls = " / ".join(f"{ms[n]:.2f}" if n in ms else "-" for n in ("16", "56", "128"))
        print(f"| {variant} | {r['first_pass_s']:.2f} s | {calls} ms | {r['frontend_compiles'] or '-'} |")


# ------------------------------------------------------------------------------------------ driver

def _child(args: list[str], timeout: float = 900) -> dict:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return {"error": (tail[-1] if tail else f"exit code {proc.returncode}")[:500]}
    return json.loads(lines[-1])


def _machine() -> dict:
    import torch
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        flags = []
    try:
        import openvino
        ov_version = openvino.get_version()
    except ImportError:
        ov_version = None
    return {"cpu": cpu, "cores": os.cpu_count(), "bf16_units": bool({"avx512_bf16", "amx_bf16"} & set(flags)),
            "python": platform.python_version(), "torch": torch.__version__, "openvino": ov_version,
            "torch_threads": torch.get_num_threads()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,16")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--threads", default="default,1",
                   help="thread settings to run: 'default' (torch's own) and/or numbers (default: default,1)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "openvino-cpu.json"))
    p.add_argument("--one", nargs=4, metavar=("MODEL", "BATCH", "VARIANT", "THREADS"), help=argparse.SUPPRESS)
    p.add_argument("--cache-probe", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--dynamic-probe", nargs=2, metavar=("VARIANT", "THREADS"), help=argparse.SUPPRESS)
    p.add_argument("--dynamic-only", action="store_true",
                   help="run only the dynamic-lengths row (writes results/openvino-dynamic-cpu.json)")
    p.add_argument("--min-s", type=float, default=2.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        threads = None if args.one[3] == "default" else int(args.one[3])
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.one[2], threads, args.min_s, 30)))
        return
    if args.cache_probe:
        print(json.dumps(measure_cache(args.cache_probe)))
        return
    if args.dynamic_probe:
        threads = None if args.dynamic_probe[1] == "default" else int(args.dynamic_probe[1])
        print(json.dumps(measure_dynamic(args.dynamic_probe[0], threads)))
        return
    if args.dynamic_only:
        threads = args.threads.split(",")[0]
        dynamic = run_dynamic(threads)
        out = os.path.join(HERE, "results", "openvino-dynamic-cpu.json")
        with open(out, "w") as f:
            json.dump({"benchmark": "benchmarks/openvino_suite.py --dynamic-only", "threads": threads,
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": _machine(), "lengths": LENGTHS, "results": dynamic}, f, indent=1)
        print_dynamic(dynamic)
        print(f"\nwrote {out}")
        return

    repeats = args.repeats or (1 if args.quick else 3)
    min_s = "0.5" if args.quick else str(args.min_s)
    grid = [(t, m, int(b), v) for t in args.threads.split(",") for m in args.models.split(",")
            for b in args.batches.split(",") for v in args.variants.split(",")]
    load_before = os.getloadavg()
    runs: dict = {}
    for rep in range(repeats):
        for threads, model, batch, variant in grid:
            res = _child(["--one", model, str(batch), variant, threads, "--min-s", min_s])
            runs.setdefault((threads, model, batch, variant), []).append(res)
            shown = f"{res['ms']:.2f} ms" if "ms" in res else f"FAILED: {res['error'][:100]}"
            print(f"[{rep + 1}/{repeats}] threads={threads} {model} b{batch} {variant}: {shown}", flush=True)

    cache = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache["cold"] = _child(["--cache-probe", tmp])
        cache["warm"] = _child(["--cache-probe", tmp])
    dynamic = run_dynamic(args.threads.split(",")[-1])

    results = []
    for (threads, model, batch, variant), reps in runs.items():
        ok = [r for r in reps if "ms" in r]
        entry = {"threads": threads, "model": model, "batch": batch, "variant": variant}
        if ok:
            entry.update(ms=statistics.median(r["ms"] for r in ok), ms_repeats=[r["ms"] for r in ok],
                         ms_best=min(r["ms"] for r in ok), cpu_ms=statistics.median(r["cpu_ms"] for r in ok),
                         torch_threads=ok[0]["torch_threads"], load_1min=[r["load_1min"] for r in ok],
                         first_call_s=statistics.median(r["first_call_s"] for r in ok))
            if "max_rel_err" in ok[0]:
                entry["max_rel_err"] = max(r["max_rel_err"] for r in ok)
        if len(ok) < len(reps):
            entry["error"] = next(r["error"] for r in reps if "error" in r)
        results.append(entry)
    eager = {(r["threads"], r["model"], r["batch"]): r.get("ms") for r in results if r["variant"] == "eager"}
    for r in results:
        base = eager.get((r["threads"], r["model"], r["batch"]))
        if r.get("ms") and base:
            r["speedup_vs_eager"] = round(base / r["ms"], 3)
        base_cpu = next((e.get("cpu_ms") for e in results if e["variant"] == "eager" and
                         (e["threads"], e["model"], e["batch"]) == (r["threads"], r["model"], r["batch"])), None)
        if r.get("cpu_ms") and base_cpu and r["threads"] == "1":
            r["cpu_speedup_vs_eager"] = round(base_cpu / r["cpu_ms"], 3)

    report = {
        "benchmark": "benchmarks/openvino_suite.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "method": "one process per (model, batch, variant); median of >=30 calls and >=%ss after 5 warm-up calls; "
                  "median over %d interleaved repeats; threads 'default' = torch's default count (OpenVINO "
                  "the same), '1' = torch.set_num_threads(1) and INFERENCE_NUM_THREADS=1" % (min_s, repeats),
        "load_average": {"before": [round(v, 2) for v in load_before],
                         "after": [round(v, 2) for v in os.getloadavg()]},
        "results": results,
        "model_caching_convnet6_b1": cache,
        "dynamic_lengths_encoder_layer_b1": dynamic,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print_table(results, cache)
    print_dynamic(dynamic)
    print(f"\nwrote {args.out}")


def print_table(results: list, cache: dict) -> None:
    by = {(r["threads"], r["model"], r["batch"], r["variant"]): r for r in results}
    variants = [v for v in VARIANTS if any(k[3] == v for k in by)]
    print("\n| threads | model | batch | " + " | ".join(variants) + " |")
    print("|---|---|---|" + "---|" * len(variants))
    for threads, model, batch in dict.fromkeys(k[:3] for k in by):
        cells = []
        for v in variants:
            r = by.get((threads, model, batch, v))
            if r is None:
                cells.append("")
            elif "ms" not in r:
                cells.append("failed")
            else:
                speed = f" ({r['speedup_vs_eager']:.2f}x)" if v != "eager" and "speedup_vs_eager" in r else ""
                cells.append(f"{r['ms']:.2f} ms{speed}")
        shown = f"{threads} ({by[(threads, model, batch, variants[0])].get('torch_threads', '?')})" \
            if threads == "default" else threads
        print(f"| {shown} | {model} | {batch} | " + " | ".join(cells) + " |")
    cpu_rows = [k for k in dict.fromkeys(k[:3] for k in by) if k[0] == "1"]
    if cpu_rows:
        print("\nthreads=1, CPU time per call (not disturbed by other processes sharing the cores):")
        print("| model | batch | " + " | ".join(variants) + " |")
        print("|---|---|" + "---|" * len(variants))
        for threads, model, batch in cpu_rows:
            cells = []
            for v in variants:
                r = by.get((threads, model, batch, v)) or {}
                speed = f" ({r['cpu_speedup_vs_eager']:.2f}x)" if "cpu_speedup_vs_eager" in r else ""
                cells.append(f"{r['cpu_ms']:.2f} ms{speed}" if "cpu_ms" in r else "failed")
            print(f"| {model} | {batch} | " + " | ".join(cells) + " |")
    failures = {r["variant"]: r["error"] for r in results if "error" in r}
    for variant, error in failures.items():
        print(f"\n{variant} failed: {error}")
    if "first_call_s" in cache.get("cold", {}):
        print(f"\nmodel caching (convnet6, b1), first call: cold {cache['cold']['first_call_s']:.3f}s "
              f"(backend {cache['cold']['backend_s']:.3f}s), warm {cache['warm']['first_call_s']:.3f}s "
              f"(backend {cache['warm']['backend_s']:.3f}s)")


if __name__ == "__main__":
    main()
