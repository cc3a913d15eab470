"""Probe (issue 31): ember's steady-state per-step host time under FSDP2 (or DDP: ``--strategy ddp``),
against eager's.

One process (world size 1, gloo on a free localhost port; ``--device cuda``: NCCL; or torchrun's ranks) builds
the tiny (or full, ``--full``) GPT-2 of benchmarks/distributed.py twice with the harness's own
``build_model``/``wrap`` (``fully_shard`` per block + root, bf16 autocast), compiles one copy with
ember, warms both up, then times ``--steps`` steady steps (forward + backward + AdamW step + zero_grad)
alternating eager and ember step by step (paired: the host's load hits both alike), with the host time
of each phase (forward, backward, optimizer) and ember's frame entries per step (entries of its compiled
frames, resume functions, loop segments and break callees entered in one step). Then cProfile over
``--prof-steps`` more ember steps and the top functions by own and cumulative time.

    flock /tmp/ember-cpu-bench.lock python benchmarks/probes/fsdp_host.py            # CPU, tiny
    # one GPU (world size 1, NCCL): which layer of ember adds host time (frontend only, + AOT wrapper,
    # + native kernels), with cProfile's own time per step by origin for eager and ember
    python benchmarks/probes/fsdp_host.py --device cuda --full --compilers eager,ember:eager,ember:aot_eager,ember \
        --profile eager,ember --guard-cost --out r.json
    # the harness's setting (2 ranks), paired against torch.compile too: the same under torchrun
    torchrun --nproc_per_node 2 benchmarks/probes/fsdp_host.py --device cuda --full \
        --compilers eager,ember,torch --profile eager,ember --guard-cost --out r.json

On a CPU the step's compute is tiny, so its time is mostly host time; on a GPU the step time includes
waiting for the device (synchronised each step), so compare ``ember - eager`` there.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import distributed as harness  # noqa: E402  (benchmarks/distributed.py: build_model, wrap, LossOf)


def setup(device) -> int:
    """The process group: under torchrun its ranks (as the harness's 2-GPU runs), else world size 1 on a
    free localhost port. Returns this process's rank."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # as the harness's worker
        torch.backends.cudnn.allow_tf32 = True
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    return rank


def make(compiler, args, device):
    """``compiler``: eager, ember[:<backend>] (``ember:eager``: ember's frontend, the FX graphs run
    as they are: the frontend's own cost; ``ember:aot_eager``: plus the AOT autograd wrapper), or
    torch[:<backend>] (torch.compile, as the harness's third column; default inductor)."""
    model, blocks, vocab, _ = harness.build_model(args.model, not args.full, device)
    if args.strategy == "ddp":  # as the harness: DDP wraps the loss module, FSDP2 shards the model
        wrapped = harness.wrap("ddp", harness.LossOf(model), blocks, device)
    else:
        wrapped = harness.LossOf(harness.wrap("fsdp2", model, blocks, device))
    if compiler.startswith("ember"):
        import ember
        wrapped = ember.compile(wrapped, backend=compiler.partition(":")[2] or "ember")
    elif compiler.startswith("torch"):
        wrapped = torch.compile(wrapped, backend=compiler.partition(":")[2] or "inductor")
    opt = harness.make_optimizer(model.parameters(), args, device)
    return wrapped, opt, vocab


PHASES = ("forward", "backward", "optimizer")
# the forward's autocast, as the harness's (bf16 autocast for GPT-2's fp32 weights; none for bf16 Llama)
AMP = {"model": "gpt2"}


def step(fn, opt, ids, device, phases=None):
    """One training step; returns (host seconds: until the Python work returned, before waiting for the
    device; step seconds: until the device finished). On a CPU both are the same. ``phases``: a list
    that gets the host seconds of the forward, the backward and the optimizer step + zero_grad (no
    synchronisation between them: on a GPU, where the host's time goes, not the device's)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    with harness.autocast_of(AMP["model"], argparse.Namespace(gpt2_fp32=False), device):
        loss = fn(ids)
    t_fwd = time.perf_counter()
    loss.backward()
    t_bwd = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    host = time.perf_counter()
    if phases is not None:
        phases[:] = [t_fwd - t, t_bwd - t_fwd, host - t_bwd]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return host - t, time.perf_counter() - t


def top(prof, key, n):
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][3 if key == "cumulative" else 2])[:n]
    out = []
    for (file, line, fn), (_, ncalls, tt, ct, _) in rows:
        file = os.path.relpath(file, REPO) if file.startswith(str(REPO)) else file.split("site-packages/")[-1]
        out.append(f"{(ct if key == 'cumulative' else tt) * 1000:8.2f} ms {ncalls:6d} {file}:{line}({fn})")
    return out


GROUPS = (("ember entry/resume (generated)", ("<ember entry", "__break_", "__driver_", "__resume")),
          ("ember kernels/wrappers (generated)", (".cache/ember",)), ("ember/frontend", ("ember/frontend",)),
          ("ember/aot", ("ember/aot",)), ("ember/native", ("ember/native",)), ("ember other", ("ember/",)),
          ("torch.distributed (FSDP2, DTensor)", ("torch/distributed",)), ("torch.optim", ("torch/optim",)),
          ("torch other", ("torch/",)), ("transformers", ("transformers/",)))


def by_group(prof, steps):
    """Own time per step (ms) by where the function lives (C builtins counted as 'builtins (C)')."""
    out: dict = {}
    for (file, line, fn), (_, _, tt, _, _) in prof.stats.items():
        where = f"{file}:{fn}"
        name = next((g for g, keys in GROUPS if any(k in where for k in keys)),
                    "builtins (C: ATen ops, autograd engine)" if file == "~" else "other Python")
        out[name] = out.get(name, 0.0) + 1000 * tt / steps
    return dict(sorted(((k, round(v, 3)) for k, v in out.items()), key=lambda kv: -kv[1]))


def guard_cost(fn, opt, ids, device, reps=100) -> list:
    """Per generated entry function of ember's caches: its guards and argument assembly in µs per
    call, measured on one real step: at each call the entry is first run ``reps`` times with what it
    calls (``__graph``, ``__break_fn_*``, ``__resume*``: the compiled graph, the code after a graph break)
    replaced by a stub, then once for real. Rows: (entry, calls in the step, µs per call, µs in the step)."""
    import re

    from ember.frontend import cache as frame_cache
    stubbed = re.compile(r"__graph$|__break_fn_\d+$|__resume")
    timings: dict = {}
    patched = []
    for c in list(frame_cache.ALL_CACHES):
        for e in c.entries:
            name = e.source.split("(")[0][4:]
            ns = e.namespace

            def timed(*a, __orig=e.fn, __name=name, __ns=ns, **k):
                saved = {x: v for x, v in __ns.items() if stubbed.match(x)}
                __ns.update({x: (lambda *aa, **kk: (None,) * 64) for x in saved})
                try:
                    t = time.perf_counter()
                    for _ in range(reps):
                        out = __orig(*a, **k)
                    us = (time.perf_counter() - t) / reps * 1e6
                finally:
                    __ns.update(saved)
                timings.setdefault(__name + (" (miss)" if out is frame_cache.MISS else ""), []).append(us)
                return __orig(*a, **k)
            patched.append((e, e.fn))
            e.fn = timed
    try:
        step(fn, opt, ids, device)
    finally:
        for e, orig in patched:
            e.fn = orig
    rows = [(n, len(v), round(statistics.median(v), 2), round(sum(v), 1)) for n, v in timings.items()]
    return sorted(rows, key=lambda r: -r[3])


def frames_per_step(fn, opt, ids, device) -> dict:
    """How many times each generated entry of ember's caches (the compiled frame, its resume functions
    and loop segments, the callees compiled at its breaks) is entered in one step, and how many of those
    calls missed (fell through to the next entry or a compile)."""
    from ember.frontend import cache as frame_cache
    calls: dict = {}
    patched = []
    for c in list(frame_cache.ALL_CACHES):
        for e in c.entries:
            name = e.source.split("(")[0][4:]

            def counted(*a, __orig=e.fn, __name=name, **k):
                out = __orig(*a, **k)
                rec = calls.setdefault(__name, [0, 0])
                rec[0] += 1
                rec[1] += out is frame_cache.MISS
                return out
            patched.append((e, e.fn))
            e.fn = counted
    try:
        step(fn, opt, ids, device)
    finally:
        for e, orig in patched:
            e.fn = orig
    return dict(entries_called=sum(v[0] for v in calls.values()), misses=sum(v[1] for v in calls.values()),
                distinct_entries=len(calls), per_entry=calls)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama1b"])
    ap.add_argument("--strategy", default="fsdp2", choices=["fsdp2", "ddp"], help="as the harness's --strategies")
    ap.add_argument("--full", action="store_true", help="the full-size model (default: the tiny config)")
    ap.add_argument("--layers", type=int, default=None,
                    help="blocks of the tiny config (default the harness's 4; 12: full GPT-2's count of "
                         "FSDP2 blocks, so ember's per-block host costs add up as there, at tiny widths)")
    ap.add_argument("--batch", type=int, default=None, help="default 2 (tiny) or 8 (--full), as the harness")
    ap.add_argument("--seq", type=int, default=None, help="default 32 (tiny) or 512 (--full)")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--optim", choices=["foreach", "fused"], default="foreach", help="as the harness's --optim")
    ap.add_argument("--prof-steps", type=int, default=10)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--compilers", default="eager,ember",
                    help="timed round-robin; eager, ember, ember:eager, ember:aot_eager (ember's backends), "
                         "torch[:backend] (torch.compile, inductor unless named)")
    ap.add_argument("--profile", default=None, help="which compilers to cProfile, comma-separated (default: the last)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (default 1 on a CPU: steadier on a shared host; untouched on GPUs)")
    ap.add_argument("--guard-cost", action="store_true",
                    help="also time each ember entry's guards + argument assembly (graphs stubbed) over one step")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    AMP["model"] = args.model
    if args.layers:
        harness.TINY_LAYERS = args.layers
    args.batch = args.batch or (8 if args.full else 2)
    args.seq = args.seq or (512 if args.full else 32)
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if args.device == "cuda" else "cpu")
    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else 0)
    if threads:
        torch.set_num_threads(threads)
    rank = setup(device)
    if rank != 0:  # every rank runs the same steps (collectives); rank 0 reports
        sys.stdout = open(os.devnull, "w")
    compilers = args.compilers.split(",")
    runs = {c: make(c, args, device) for c in compilers}
    vocab = next(iter(runs.values()))[2]
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(device) for _ in range(4)]
    for i in range(args.warmup):
        for c, (fn, opt, _) in runs.items():
            step(fn, opt, ids[i % 4], device)
    times = {c: [] for c in compilers}
    host_times = {c: [] for c in compilers}
    phase_times = {c: [] for c in compilers}  # per step: [forward, backward, optimizer] host ms
    phases: list = []
    # Python's garbage collections during each compiler's steps: (count, ms) per generation
    collections = {c: {g: [0, 0.0] for g in range(3)} for c in compilers}
    running, gc_start = [None], [0.0]

    def on_gc(phase, info):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        elif running[0] is not None:
            rec = collections[running[0]][info["generation"]]
            rec[0] += 1
            rec[1] += 1000 * (time.perf_counter() - gc_start[0])
    gc.callbacks.append(on_gc)
    for i in range(args.steps):
        for c in (compilers if i % 2 == 0 else compilers[::-1]):
            fn, opt, _ = runs[c]
            running[0] = c
            host, total = step(fn, opt, ids[i % 4], device, phases)
            running[0] = None
            times[c].append(1000 * total)
            host_times[c].append(1000 * host)
            phase_times[c].append([1000 * x for x in phases])
    gc.callbacks.remove(on_gc)
    med = {c: statistics.median(v) for c, v in times.items()}
    host_med = {c: statistics.median(v) for c, v in host_times.items()}
    q = {c: [round(x, 3) for x in statistics.quantiles(v, n=4)] for c, v in times.items()}
    report = dict(device=str(device), model=args.model, full=args.full, batch=args.batch, seq=args.seq,
                  steps=args.steps, step_ms_median=med, step_ms_quartiles=q, host_ms_median=host_med,
                  minus_eager_ms={c: med[c] - med["eager"] for c in med} if "eager" in med else None,
                  step_ms_min={c: min(v) for c, v in times.items()},
                  # round i's difference to eager's step of the same round (the host's load drifts less
                  # within a round than across the run): the median of those
                  paired_minus_eager_ms={c: statistics.median(a - b for a, b in zip(times[c], times["eager"]))
                                         for c in compilers} if "eager" in times else None,
                  gc_per_generation={c: {g: [n, round(ms, 3)] for g, (n, ms) in v.items()} for c, v in collections.items()},
                  gc_objects=len(gc.get_objects()), prof_steps=args.prof_steps, profiles={})
    # host ms of each phase (median over the steps), and the paired difference to eager's same step
    report["phase_host_ms_median"] = {c: {p: round(statistics.median(s[k] for s in v), 3) for k, p in enumerate(PHASES)}
                                      for c, v in phase_times.items()}
    if "eager" in phase_times:
        report["phase_paired_minus_eager_ms"] = {
            c: {p: round(statistics.median(a[k] - b[k] for a, b in zip(v, phase_times["eager"])), 3)
                for k, p in enumerate(PHASES)} for c, v in phase_times.items()}
    print(f"per-step ms (median [q1 q3] over {args.steps} round-robin steps):")
    for c in med:
        print(f"  {c:16} {med[c]:8.3f} {q[c]} min {min(times[c]):8.3f}"
              + (f"  {report['paired_minus_eager_ms'][c]:+.3f} vs eager (paired)" if "eager" in med else "")
              + (f"   host {host_med[c]:8.3f}" if device.type == "cuda" else "")
              + "   gc (count, ms) gen0/1/2 over the steps: " + " ".join(f"{n}/{ms:.1f}" for n, ms in collections[c].values()))
    print(f"  ({report['gc_objects']} objects tracked by the garbage collector)")
    print("host ms per phase (median), and paired vs eager:")
    for c, v in report["phase_host_ms_median"].items():
        d = (report.get("phase_paired_minus_eager_ms") or {}).get(c)
        print(f"  {c:16} " + "  ".join(f"{p} {v[p]:8.3f}" + (f" ({d[p]:+.3f})" if d else "") for p in PHASES))
    report["frames_per_step"] = {}
    for c in compilers:
        if c.startswith("ember"):
            f = report["frames_per_step"][c] = frames_per_step(runs[c][0], runs[c][1], ids[0], device)
            print(f"{c}: {f['entries_called']} entries of compiled frames called per step "
                  f"({f['distinct_entries']} distinct, {f['misses']} misses)")
    for profiled in (args.profile or compilers[-1]).split(","):
        prof = cProfile.Profile()
        fn, opt, _ = runs[profiled]
        prof.enable()
        for i in range(args.prof_steps):
            step(fn, opt, ids[i % 4], device)
        prof.disable()
        prof.create_stats()
        rep = report["profiles"][profiled] = dict(own_ms_per_step=by_group(prof, args.prof_steps),
                                                  own=top(prof, "own", args.top),
                                                  cumulative=top(prof, "cumulative", args.top))
        print(f"\n{profiled} under cProfile, own time per step by origin (ms):")
        for k, v in rep["own_ms_per_step"].items():
            print(f"  {v:8.3f}  {k}")
        if args.top:
            print(f"\n{profiled}, {args.prof_steps} profiled steps, top by own time (total ms, calls):")
            print("\n".join(rep["own"]))
            print("\nby cumulative time:")
            print("\n".join(rep["cumulative"]))
    if args.guard_cost:
        report["guard_cost"] = {}
        for c in compilers:
            if c.startswith("ember"):
                rows = report["guard_cost"][c] = guard_cost(runs[c][0], runs[c][1], ids[0], device)
                print(f"\n{c}: guards + argument assembly per entry (graphs stubbed), one step: "
                      f"{sum(r[3] for r in rows):.1f} us in all")
                for r in rows:
                    print(f"  {r[0]:28} calls {r[1]:3d}  {r[2]:8.2f} us/call  {r[3]:8.1f} us")
    if args.out and rank == 0:
        Path(args.out).write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
