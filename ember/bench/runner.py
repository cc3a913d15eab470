"""Runs the workloads: eager, each requested ember backend and, on request, the torch.compile peer.

Per workload, in this process: eager's output is the reference; each ember backend compiles a fresh
``ember.compile`` (the first call, timed alone, is the compile time) and is checked against eager;
then eager and every compiled variant are timed in turns (``measure.median_ms``).

ember itself never calls torch.compile. The peer column comes from ``benchmarks/bench_peer.py``, a
script of the source checkout, run as a child process over the same workloads (it imports
``ember.bench.workloads``). It reports its own eager time next to its compiled time, and its speedup
is the ratio of the two, measured in that process.
"""
from __future__ import annotations

import datetime
import functools
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

import ember
from ember.bench import measure, workloads
from ember.bench.progress import Progress

PEER_SCRIPT = Path("benchmarks") / "bench_peer.py"


class BenchError(Exception):
    """A problem with the request itself (unknown workload, no peer script); the CLI prints it and exits 2."""


def variant_name(backend: str) -> str:
    return "ember" if backend == "ember" else f"ember:{backend}"


def find_peer_script(explicit: str | None) -> Path:
    """``--peer-script``, else ``benchmarks/bench_peer.py`` of the checkout this ember was imported from."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise BenchError(f"--peer-script {explicit}: no such file")
        return path
    path = Path(ember.__file__).resolve().parent.parent / PEER_SCRIPT
    if not path.is_file():
        raise BenchError(
            "the torch.compile column needs benchmarks/bench_peer.py from an ember source checkout (ember "
            f"itself never calls torch.compile); looked for {path}. Pass --peer-script PATH to that file, or "
            "leave out --with-torch-compile.")
    return path


def run(opts) -> dict:
    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    suite = opts.suite or ("gpu" if device.startswith("cuda") else "quick")
    try:
        chosen = workloads.select(suite, opts.workloads)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    peer = find_peer_script(opts.peer_script) if opts.with_torch_compile else None
    dtype = getattr(torch, opts.dtype)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    backends = [b.strip() for b in opts.backends.split(",") if b.strip()]
    steps = len(chosen) * (1 + len(backends)) + (len(chosen) if peer else 0)
    progress = Progress(steps, enabled=not opts.no_progress)
    results: list[dict] = []
    for w in chosen:
        results += _measure(w, suite, device, dtype, backends, opts, progress)
    if peer:
        results += _run_peer(peer, [w.name for w in chosen], suite, device, opts, progress)
    progress.close()
    return dict(benchmark="ember bench", date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                suite=suite, device=device, device_name=_device_name(device), dtype=opts.dtype,
                python=platform.python_version(), torch=torch.__version__, ember=ember.__version__,
                torch_threads=torch.get_num_threads(), warmup=opts.warmup, iters=opts.iters,
                peer=(f"torch.compile (backend {opts.peer_backend}) via {peer}" if peer else None), results=results)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"


def _measure(w, suite, device, dtype, backends, opts, progress) -> list[dict]:
    base = dict(workload=w.name, description=w.description)
    if w.needs and importlib.util.find_spec(w.needs) is None:
        progress.advance(1 + len(backends), f"{w.name}: skipped")
        return [dict(base, variant=v, status="skipped", error=f"needs {w.needs}")
                for v in ["eager"] + [variant_name(b) for b in backends]]
    rtol, atol = measure.tolerance(device, dtype)
    progress.label(f"{w.name}: eager")
    fn, args = workloads.build(w, suite, device, dtype)
    records = {"eager": dict(base, variant="eager", status="ok", compile_s=None, match=True, max_abs_err=0.0)}
    calls = {"eager": functools.partial(fn, *args)}
    with torch.no_grad():
        ref = fn(*args)
        progress.advance(1)
        for backend in backends:
            name = variant_name(backend)
            progress.label(f"{w.name}: {name} (compiling)")
            rec = records[name] = dict(base, variant=name)
            try:
                compiled = ember.compile(fn, backend=backend)
                out, rec["compile_s"] = measure.first_call(lambda: compiled(*args), device)
                rec["match"], rec["max_abs_err"], why = measure.compare(ref, out, rtol, atol)
                rec.update(status="ok" if rec["match"] else "mismatch", error=why or None)
                calls[name] = functools.partial(compiled, *args)
            except Exception as exc:  # reported in the table, never a silent wrong number
                rec.update(status="error", error=f"{type(exc).__name__}: {exc}"[:500])
            progress.advance(1)
        progress.label(f"{w.name}: timing")
        times = measure.median_ms(calls, device, opts.warmup, opts.iters)
    eager_ms = times["eager"]["ms"]
    for name, t in times.items():
        records[name].update(ms=t["ms"], min_ms=t["min_ms"], eager_ms=eager_ms, speedup=eager_ms / t["ms"])
    return list(records.values())


def _run_peer(script: Path, names: list[str], suite, device, opts, progress) -> list[dict]:
    """Run the peer script; it prints one ``PEER {json}`` line per workload."""
    cmd = [sys.executable, str(script), "--suite", suite, "--workloads", ",".join(names), "--device", device,
           "--dtype", opts.dtype, "--warmup", str(opts.warmup), "--iters", str(opts.iters),
           "--backend", opts.peer_backend, "--threads", str(opts.threads)]
    progress.label(f"torch.compile: {names[0]} (compiling)")
    records = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("PEER "):
            records.append(json.loads(line[5:]))
            done = len(records)
            progress.advance(1, f"torch.compile: {names[done]} (compiling)" if done < len(names) else "")
    stderr = proc.stderr.read()
    proc.wait()
    seen = {r["workload"] for r in records}
    variant = "torch.compile" if opts.peer_backend == "inductor" else f"torch.compile:{opts.peer_backend}"
    tail = (stderr.strip().splitlines() or ["no output"])[-1][:300]
    for name in names:  # a crashed peer leaves holes: report them rather than drop rows
        if name not in seen:
            records.append(dict(workload=name, variant=variant, status="error",
                                error=f"peer process exit {proc.returncode}: {tail}"))
            progress.advance(1)
    return records
