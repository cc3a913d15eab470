"""The model zoo: does ember work on models like yours, how much faster is it, and why not when not.

    python benchmarks/zoo.py                        # all installed models on CPU, ember vs eager vs torch.compile
    python benchmarks/zoo.py --quick --no-peer      # fewer timed calls, no torch.compile column
    python benchmarks/zoo.py --models bert,gpt2,t5  # names, suites (huggingface, timm, torchvision) or families
    python benchmarks/zoo.py --device cuda --out benchmarks/results/zoo-h100.json

The models and their inputs are in zoo_models.py (tiny configs, random weights, no downloads). For
each model, in a process of its own (so a crash or a hang costs only that model):

1. eager: the reference outputs for two input shapes, and the median time per call;
2. ``ember.explain(model)`` (backend "eager": graphs and breaks are decided by the frontend alone):
   graphs, graph breaks with their reasons and file:line, whole callables run eagerly;
3. ``ember.compile(model, backend=--backend)``: the first call (compile time), the outputs against
   eager, the median time per call, then the second shape: how many frames recompile and why (the
   ``recompiles`` log artifact, i.e. EMBER_LOGS=recompiles) and its outputs against eager;
4. the peer, ``torch.compile(model)`` with its default backend: compile time, time per call,
   outputs against eager, graphs and breaks (torch's own counters). Skipped with --no-peer.

Everything runs under ``torch.no_grad()`` (inference). The compiler caches (ember's, Triton's,
Inductor's) point at a fresh directory per zoo run, so compile times are cold for both compilers.
With --jobs N, N models run at once but only one at a time is timed (a file lock), so the timings
see an otherwise idle accelerator. On CPU each model uses one intra-op thread by default: on a small
shared machine, threads waiting for each other otherwise swamp what is being measured.

Writes the JSON (--out, default benchmarks/results/zoo-<device>.json) and a markdown report next to
it: a summary like Table 1 of the PyTorch 2 paper, a per-model table, and every break and failure reason.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # zoo_models, and ember from a checkout without installing

import zoo_models  # noqa: E402
from _proc import exclusive_lock  # noqa: E402

TIMING = {"full": (3, 20), "quick": (1, 5)}   # (warm-up calls, timed calls)


# ------------------------------------------------------------------------------------------ one model (child)



def _emit(record: dict) -> None:
    print("ZOO " + json.dumps(record), flush=True)


def measure_model(name: str, args) -> None:
    """Child process: print one `ZOO {...}` line for ember, then one for the peer."""
    import warnings

    import torch

    import ember
    from ember.bench.measure import compare, first_call, median_ms, tolerance

    warnings.simplefilter("ignore")  # eager fallbacks warn once each; the report lists them anyway
    if args.threads:
        torch.set_num_threads(args.threads)
    # fp32 means fp32: with TF32 convolutions (cuDNN's default) eager and compiled code would differ by
    # the algorithm each picks, not by what the compiler did
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    spec = zoo_models.MODELS[name]
    dtype = getattr(torch, args.dtype)
    rtol, atol = tolerance(args.device, dtype)
    warmup, iters = TIMING["quick" if args.quick else "full"]
    model, inputs = zoo_models.build(spec, args.device, dtype)
    (a_args, a_kw), (b_args, b_kw) = inputs(0), inputs(1)
    rec: dict = {"phase": "ember"}

    with torch.no_grad():
        ref_a, ref_b = model(*a_args, **a_kw), model(*b_args, **b_kw)
        eager = lambda: model(*a_args, **a_kw)  # noqa: E731
        try:
            report = ember.explain(model)(*a_args, **a_kw)
            rec.update(graphs=report.graph_count, graph_breaks=report.graph_break_count + len(report.fallbacks),
                       ops=report.op_count,
                       break_reasons=[{"location": b.location, "reason": b.reason} for b in report.break_reasons],
                       fallbacks=[{"function": f, "reason": str(why)} for f, why in report.fallbacks])
            compiled = ember.compile(model, backend=args.backend)
            out_a, rec["compile_s"] = first_call(lambda: compiled(*a_args, **a_kw), args.device)
            ok_a, err_a, why_a = compare(ref_a, out_a, rtol, atol)
            with exclusive_lock(args.lock):
                t = median_ms({"eager": eager, "ember": lambda: compiled(*a_args, **a_kw)}, args.device, warmup, iters)
            rec.update(eager_ms=t["eager"]["ms"], compiled_ms=t["ember"]["ms"],
                       speedup=t["eager"]["ms"] / t["ember"]["ms"])
            with log_lines("recompiles") as reasons:  # the second shape: what recompiles, and why
                out_b, rec["recompile_s"] = first_call(lambda: compiled(*b_args, **b_kw), args.device)
            ok_b, err_b, why_b = compare(ref_b, out_b, rtol, atol)
            rec.update(recompiles=len(reasons), recompile_reasons=reasons, match=ok_a and ok_b,
                       max_abs_err=err_a if err_a != err_a or err_a > err_b else err_b,  # NaN (x != x) wins
                       status="ok" if ok_a and ok_b else "mismatch", error=why_a or why_b or None)
        except Exception as exc:
            rec.update(status="error", error=f"{type(exc).__name__}: {exc}"[:2000],
                       traceback=traceback.format_exc()[-4000:])
        if "eager_ms" not in rec:  # ember failed before it was timed
            with exclusive_lock(args.lock):
                rec["eager_ms"] = median_ms({"eager": eager}, args.device, warmup, iters)["eager"]["ms"]
        _emit(rec)
        if not args.no_peer:
            _emit(_measure_peer(model, a_args, a_kw, ref_a, eager, args, warmup, iters, rtol, atol))


@contextlib.contextmanager
def log_lines(artifact: str):
    """The messages of one EMBER_LOGS artifact logged while the block runs (they go to stderr too)."""
    import logging

    import ember
    from ember.diagnostics import logging as elog

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    ember.config.logs = ",".join(filter(None, [ember.config.logs, artifact]))
    elog.refresh()
    handler = Collect()
    logging.getLogger(f"ember.{artifact}").addHandler(handler)
    try:
        yield lines
    finally:
        logging.getLogger(f"ember.{artifact}").removeHandler(handler)


def _measure_peer(model, a_args, a_kw, ref, eager, args, warmup, iters, rtol, atol) -> dict:
    """torch.compile with its default backend; benchmarks may drive the peer directly."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from ember.bench.measure import compare, first_call, median_ms

    rec: dict = {"phase": "peer"}
    try:
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(model)
        out, rec["compile_s"] = first_call(lambda: compiled(*a_args, **a_kw), args.device)
        ok, err, why = compare(ref, out, rtol, atol)
        with exclusive_lock(args.lock):  # eager again, in turns with the peer (see ember/bench/measure.py)
            t = median_ms({"eager": eager, "peer": lambda: compiled(*a_args, **a_kw)}, args.device, warmup, iters)
        breaks = counters["graph_break"]
        rec.update(eager_ms=t["eager"]["ms"], ms=t["peer"]["ms"], speedup=t["eager"]["ms"] / t["peer"]["ms"],
                   match=ok, max_abs_err=err, status="ok" if ok else "mismatch", error=why or None,
                   graphs=counters["stats"]["unique_graphs"], graph_breaks=sum(breaks.values()),
                   break_reasons=[{"reason": r, "count": n} for r, n in breaks.most_common(10)])
    except Exception as exc:
        rec.update(status="error", error=f"{type(exc).__name__}: {exc}"[:2000])
    return rec


# ---------------------------------------------------------------------------------------- the run (parent)

def run_model(spec, args, env: dict) -> dict:
    """Run one model's child process; merge its records, enforcing --timeout then --peer-timeout."""
    rec = dict(name=spec.name, suite=spec.suite, family=spec.family, builder=spec.builder)
    cmd = [sys.executable, os.path.abspath(__file__), "--one", spec.name, "--device", args.device,
           "--backend", args.backend, "--dtype", args.dtype, "--threads", str(args.threads)]
    cmd += ["--quick"] * args.quick + ["--no-peer"] * args.no_peer + (["--lock", args.lock] if args.lock else [])
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, start_new_session=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        deadline, phase = time.monotonic() + args.timeout, "ember"
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                os.killpg(proc.pid, 9)
                limit = args.timeout if phase == "ember" else args.peer_timeout
                _store(rec, phase, dict(status="timeout", error=f"{phase} phase over {limit:.0f} s"))
                break
            if line is None:
                break
            if line.startswith("ZOO "):
                got = json.loads(line[4:])
                _store(rec, got.pop("phase"), got)
                phase, deadline = "peer", time.monotonic() + args.peer_timeout
        proc.wait()
        err.seek(0)
        tail = err.read()[-3000:]
    if "status" not in rec:  # the child died before it reported
        rec.update(status="crashed", error=f"exit {proc.returncode}: " + (tail.strip().splitlines() or ["?"])[-1],
                   stderr_tail=tail)
    if not args.no_peer and "peer" not in rec:
        rec["peer"] = dict(status="not run", error=f"the child stopped first ({rec['status']})")
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def _pump(stream, lines: queue.Queue) -> None:
    """Forward the child's stdout lines to a queue (None at the end), so the parent can wait with a timeout."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def _store(rec: dict, phase: str, got: dict) -> None:
    if phase == "ember":
        rec.update(got)
    else:
        rec["peer"] = got


def select(filters: str | None) -> list:
    specs = list(zoo_models.MODELS.values())
    if not filters:
        return specs
    keys = {f.strip() for f in filters.split(",") if f.strip()}
    unknown = keys - {k for s in specs for k in (s.name, s.suite, s.family)}
    if unknown:
        raise SystemExit(f"unknown model/suite/family {sorted(unknown)}; models: {', '.join(zoo_models.MODELS)}")
    return [s for s in specs if keys & {s.name, s.suite, s.family}]


def _line(i: int, n: int, rec: dict) -> str:
    head = f"[{i:>2}/{n}] {rec['name']:<22} {rec['status']:<9}"
    if rec["status"] in ("ok", "mismatch"):
        head += (f" graphs {rec['graphs']:>2}  breaks {rec['graph_breaks']:>2}  recompiles {rec['recompiles']}"
                 f"  err {rec['max_abs_err']:.1e}  {rec['speedup']:.2f}x")
    elif rec.get("error"):
        head += " " + " ".join(rec["error"].split())[:90]
    peer = rec.get("peer")
    if peer:
        head += f"  | peer {peer['speedup']:.2f}x" if peer.get("speedup") else f"  | peer {peer['status']}"
    return head + f"  ({rec.get('wall_s', 0):.0f} s)"


# ------------------------------------------------------------------------------------------------------ report

SUITES = ("huggingface", "timm", "torchvision")


def _geomean(values: list) -> float | None:
    import math

    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summary_rows(results: list[dict]) -> list[dict]:
    """Per suite and overall: the counts of Table 1 in the PyTorch 2 paper, plus speedups.

    Break buckets and mean graphs count the working models only (a failing model has no graph count
    worth averaging); "working" means it ran and matched eager on both input shapes.
    """
    rows = []
    for suite in [s for s in SUITES if any(r["suite"] == s for r in results)] + ["all"]:
        rs = [r for r in results if r["status"] != "skipped" and suite in ("all", r["suite"])]
        if not rs:
            continue
        ok = [r for r in rs if r["status"] == "ok"]
        peers = [r["peer"] for r in rs if "peer" in r]
        peer_ok = [p for p in peers if p.get("status") == "ok"]
        rows.append(dict(
            suite=suite, models=len(rs), working=len(ok),
            zero_breaks=sum(r["graph_breaks"] == 0 for r in ok),
            breaks_1_9=sum(1 <= r["graph_breaks"] <= 9 for r in ok),
            breaks_10_plus=sum(r["graph_breaks"] >= 10 for r in ok),
            mean_graphs=sum(r["graphs"] for r in ok) / len(ok) if ok else 0.0,
            recompile_on_new_shape=sum(r["recompiles"] > 0 for r in ok),
            geomean_speedup=_geomean([r.get("speedup") for r in ok]),
            peer_models=len(peers), peer_working=len(peer_ok),
            peer_zero_breaks=sum(p.get("graph_breaks") == 0 for p in peer_ok),
            peer_mean_graphs=sum(p["graphs"] for p in peer_ok) / len(peer_ok) if peer_ok else None,
            peer_geomean_speedup=_geomean([p.get("speedup") for p in peer_ok])))
    return rows


def _f(value, fmt: str, none: str = "-") -> str:
    return none if value is None or value != value else format(value, fmt)


def write_markdown(report: dict, path: str) -> None:
    models, peer = report["models"], report["peer"] is not None
    lines = [f"# Model zoo: ember on {report['device_name']}", "",
             f"{report['date']}; torch {report['torch']}, ember {report['ember']}, Python {report['python']}; "
             f"backend `{report['backend']}`, {report['dtype']}, inference (`torch.no_grad()`); "
             f"{report['timing']['warmup']} warm-up + median of {report['timing']['iters']} timed calls; "
             f"{report['jobs']} job(s), {report['wall_s']:.0f} s in all.", "",
             f"Command: `{report['command']}`. Models and inputs: `benchmarks/zoo_models.py`.", ""]
    if not report.get("complete", True):
        lines += [f"**Incomplete run**: {len(models)} models reported so far.", ""]
    lines += ["## Summary", "",
              "Working: compiled, and the outputs match eager on both input shapes. Break buckets, mean graphs "
              "and speedups count working models; speedup is the geometric mean of eager time / compiled time "
              "(eager and compiled timed in turns, in the same process).", ""]
    head = ["suite", "models", "working", "0 breaks", "1-9 breaks", "10+ breaks", "mean graphs/model",
            "recompile on 2nd shape", "geomean speedup"]
    if peer:
        head += ["torch.compile working", "torch.compile 0 breaks", "torch.compile mean graphs",
                 "torch.compile geomean speedup"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["summary"]:
        cells = [r["suite"], r["models"], r["working"], r["zero_breaks"], r["breaks_1_9"], r["breaks_10_plus"],
                 f"{r['mean_graphs']:.2f}", r["recompile_on_new_shape"], _f(r["geomean_speedup"], ".2f") + "x"]
        if peer:
            cells += [f"{r['peer_working']}/{r['peer_models']}", r["peer_zero_breaks"],
                      _f(r["peer_mean_graphs"], ".2f"), _f(r["peer_geomean_speedup"], ".2f") + "x"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    head = ["model", "suite", "family", "status", "graphs", "breaks", "recompiles", "max abs err", "eager ms",
            "ember ms", "speedup", "compile s"]
    if peer:
        head += ["torch.compile ms", "speedup", "compile s", "graphs / breaks"]
    lines += ["", "## Per model", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in models:
        cells = [r["name"], r["suite"], r["family"], r["status"], r.get("graphs", "-"), r.get("graph_breaks", "-"),
                 r.get("recompiles", "-"), _f(r.get("max_abs_err"), ".1e"), _f(r.get("eager_ms"), ".2f"),
                 _f(r.get("compiled_ms"), ".2f"), _f(r.get("speedup"), ".2f"), _f(r.get("compile_s"), ".2f")]
        if peer:
            p = r.get("peer", {})
            cells += [_f(p.get("ms"), ".2f") if p.get("status") == "ok" else p.get("status", "-"),
                      _f(p.get("speedup"), ".2f"), _f(p.get("compile_s"), ".1f"),
                      f"{p['graphs']} / {p['graph_breaks']}" if "graphs" in p else "-"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", "## Graph breaks, eager fallbacks and failures", ""]
    for r in models:
        notes = _reasons(r)
        if notes:
            lines += [f"**{r['name']}** ({r['status']})", ""] + [f"- {n}" for n in notes] + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    import sysconfig

    paths = sysconfig.get_paths()
    for prefix in (paths["purelib"] + "/", paths["stdlib"] + "/", os.path.dirname(HERE) + "/"):
        text = text.replace(prefix, "")
    return text if len(text) <= limit else text[:limit] + " ..."


def _reasons(r: dict) -> list[str]:
    """One line per distinct reason (with a count), so 12 identical breaks in 12 layers read as one."""
    counts: dict = {}
    for b in r.get("break_reasons", []):
        counts.setdefault(f"break: {_short(b['reason'])} (at {_short(b['location'], 120)})", []).append(1)
    for fb in r.get("fallbacks", []):
        counts.setdefault(f"runs eagerly: {_short(fb['function'])}: {_short(fb['reason'])}", []).append(1)
    if r.get("recompiles", 0) > 1:  # one recompile on the new shape is the norm; more is worth reading
        for why in r.get("recompile_reasons", []):
            counts.setdefault(f"recompile: {_short(why)}", []).append(1)
    for b in r.get("peer", {}).get("break_reasons", []):
        counts.setdefault(f"torch.compile break: {_short(b['reason'])}", []).extend([1] * b["count"])
    out = [k + (f" (x{len(v)})" if len(v) > 1 else "") for k, v in counts.items()]
    if r["status"] not in ("ok", "skipped") and r.get("error"):
        out.append(f"{r['status']}: {_short(r['error'], 600)}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="ember", help="ember backend to measure (default ember)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--models", default=None, help="comma list of model names, suites or families")
    p.add_argument("--no-peer", action="store_true", help="skip torch.compile")
    p.add_argument("--quick", action="store_true", help=f"{TIMING['quick'][1]} timed calls instead of "
                                                        f"{TIMING['full'][1]}")
    p.add_argument("--jobs", type=int, default=None,
                   help="models run at once (default: 2 on CPU; on CUDA half the cores, at most 8)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per model for eager + ember")
    p.add_argument("--peer-timeout", type=float, default=None,
                   help="seconds per model for torch.compile (default 240 on CPU, 90 on CUDA)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads per model (default: 1 on CPU, torch's default on CUDA)")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/zoo-<device>.json)")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.add_argument("--from-json", metavar="PATH", help="only rewrite the markdown report of a saved JSON")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--lock", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        measure_model(args.one, args)
        return 0
    if args.from_json:
        with open(args.from_json) as f:
            write_markdown(json.load(f), os.path.splitext(args.from_json)[0] + ".md")
        return 0

    import torch

    specs = select(args.models)
    if args.list:
        for s in specs:
            print(f"{s.name:<24} {s.suite:<12} {s.family:<16} {s.builder}")
        return 0
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = args.device.startswith("cuda")
    args.jobs = args.jobs or (min(8, max(1, (os.cpu_count() or 1) // 2)) if cuda else min(2, os.cpu_count() or 1))
    args.threads = args.threads if args.threads is not None else (0 if cuda else 1)
    args.peer_timeout = args.peer_timeout or (90 if cuda else 240)
    label = "cpu" if not cuda else torch.cuda.get_device_name(args.device).lower().replace(" ", "-")
    out = args.out or os.path.join(HERE, "results", f"zoo-{'cpu' if not cuda else 'cuda'}.json")
    scratch = tempfile.mkdtemp(prefix="ember-zoo-")
    args.lock = os.path.join(scratch, "timing.lock") if args.jobs > 1 else None
    env = dict(os.environ, EMBER_CACHE_DIR=os.path.join(scratch, "ember"),
               TRITON_CACHE_DIR=os.path.join(scratch, "triton"), TORCHINDUCTOR_CACHE_DIR=os.path.join(scratch, "inductor"),
               PYTHONWARNINGS="ignore", TRANSFORMERS_VERBOSITY="error")

    skipped = [dict(name=s.name, suite=s.suite, family=s.family, builder=s.builder, status="skipped", error=why)
               for s in specs if (why := zoo_models.available(s))]
    runnable = [s for s in specs if not zoo_models.available(s)]
    print(f"zoo: {len(runnable)} models on {args.device} ({label}), backend {args.backend!r}, "
          f"{'no peer' if args.no_peer else 'peer torch.compile'}, {args.jobs} job(s); "
          f"{len(skipped)} skipped (library not installed)", flush=True)
    t0, results = time.perf_counter(), []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:  # threads only wait on child processes
        futures = [pool.submit(run_model, spec, args, env) for spec in runnable]
        for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            results.append(fut.result())
            print(_line(i, len(runnable), results[-1]), flush=True)
            report = save(out, args, specs, results + skipped, label, time.perf_counter() - t0, i == len(runnable))
    if not runnable:
        report = save(out, args, specs, skipped, label, 0.0, True)
    md = os.path.splitext(out)[0] + ".md"
    print(f"\nwrote {os.path.relpath(out)} and {os.path.relpath(md)} in {report['wall_s']:.0f} s")
    for row in report["summary"]:
        print(f"  {row['suite']:<12} {row['working']}/{row['models']} working, {row['zero_breaks']} with 0 breaks, "
              f"mean graphs {row['mean_graphs']:.2f}, geomean speedup {row['geomean_speedup'] or 0:.2f}x")
    return 0


def save(out: str, args, specs, results: list, label: str, wall_s: float, complete: bool) -> dict:
    """Write the JSON and the markdown; called after every model, so a run cut short keeps what it measured."""
    import torch

    import ember

    order = {s.name: i for i, s in enumerate(specs)}
    results = sorted(results, key=lambda r: order[r["name"]])
    report = dict(benchmark="zoo", complete=complete,
                  date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  device=args.device, device_name=label, dtype=args.dtype, backend=args.backend,
                  peer=None if args.no_peer else "torch.compile (default backend: inductor)",
                  python=platform.python_version(), torch=torch.__version__, ember=ember.__version__,
                  cpu_count=os.cpu_count(), torch_threads=args.threads or torch.get_num_threads(), jobs=args.jobs,
                  quick=args.quick, timing=dict(zip(("warmup", "iters"), TIMING["quick" if args.quick else "full"])),
                  wall_s=round(wall_s, 1), command=" ".join(sys.argv), models=results)
    report["summary"] = summary_rows(results)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1, default=str)
        f.write("\n")
    write_markdown(report, os.path.splitext(out)[0] + ".md")
    return report


if __name__ == "__main__":
    sys.exit(main())
