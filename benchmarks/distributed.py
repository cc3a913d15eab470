"""Distributed training compiled by ember, by torch.compile, and eager (issue 31).

GPT-2 124M and a ~1B Llama-architecture model (transformers configs, random weights; Llama in bf16)
trained with DistributedDataParallel and with FSDP2 (``fully_shard`` on each block and the root),
each wrapped model run eagerly, through ``ember.compile`` and through ``torch.compile``. Per rank:
losses over the steps (compared with eager's), median step time, peak memory, cold compile time (first
step minus a steady one), graphs and recompile reasons; then the ranks' reports are compared, and a
rank whose graphs or recompiles differ from the others' (a guard divergence) is reported, not waited
for. Optionally (``--profile``) a torch.profiler trace of a few steps per run is summarised: how
much of the communication kernels' time (all-reduce, reduce-scatter, all-gather) overlaps compute.

Nothing can hang: every collective the script itself runs (agreeing on results) goes through a gloo
group with a timeout (``monitored_barrier``, object gathers), the process group has a timeout, and the
launcher kills the ranks once ``--timeout`` seconds have passed.

    # CPU, gloo, tiny configs (what CI-sized machines can run):
    python benchmarks/distributed.py --device cpu --tiny --steps 5
    # two H100s, NCCL: one model per command (each within ~5 minutes; --timeout kills a straggler)
    python benchmarks/distributed.py --device cuda --nproc 2 --models gpt2 --steps 20 --profile --timeout 540
    python benchmarks/distributed.py --device cuda --nproc 2 --models llama1b --steps 20 --timeout 540
    # or under torchrun:
    torchrun --nproc_per_node 2 benchmarks/distributed.py --device cuda --steps 20

Results: ``benchmarks/results/distributed-<machine>-<models>.json`` (``--out`` to change).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

COMM = re.compile(r"nccl|gloo|all_?reduce|reduce_?scatter|all_?gather|broadcast", re.I)


# ---- models ------------------------------------------------------------------------------------
def build_model(name: str, tiny: bool):
    """(model, blocks to shard, vocab size, dtype) with weights from a fixed seed (equal on every rank)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if name == "gpt2":
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128) if tiny else GPT2Config()
        cfg.attn_pdrop = cfg.embd_pdrop = cfg.resid_pdrop = 0.0  # dropout off: runs comparable step by step
        model, dtype = GPT2LMHeadModel(cfg), torch.float32
        blocks = list(model.transformer.h)
    elif name == "llama1b":
        # Llama 3.2 1B's shape (1.24B parameters); tiny: the same architecture, small
        cfg = (LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=256, max_position_embeddings=128) if tiny else
               LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                           num_key_value_heads=8, vocab_size=128256, max_position_embeddings=2048,
                           tie_word_embeddings=True, rope_theta=500000.0))
        cfg._attn_implementation = "sdpa"
        model, dtype = LlamaForCausalLM(cfg), torch.bfloat16
        blocks = list(model.model.layers)
    else:
        raise SystemExit(f"unknown model {name!r}: choose gpt2 or llama1b")
    model.config.use_cache = False
    return model.to(dtype), blocks, model.config.vocab_size, dtype


class LossOf(torch.nn.Module):
    """The model's forward returning the loss only (a tensor, not a ModelOutput): what gets wrapped."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


# ---- one run: model x strategy x compiler -----------------------------------------------------
def wrap(strategy: str, model, blocks, device):
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    raise SystemExit(f"unknown strategy {strategy!r}: choose ddp or fsdp2")


def compile_with(compiler: str, module, args):
    if compiler == "eager":
        return module
    if compiler == "ember":
        import ember
        return ember.compile(module)
    if compiler == "torch":
        return torch.compile(module, backend=args.torch_backend)
    raise SystemExit(f"unknown compiler {compiler!r}: choose eager, ember or torch")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch(step: int, rank: int, vocab: int, args, device):
    g = torch.Generator().manual_seed(1000 * step + rank)
    seq = args.seq + (8 if args.inject_divergence and rank == 1 and step == 2 else 0)
    return torch.randint(0, vocab, (args.batch, seq), generator=g).to(device)


def graph_stats(compiler: str, compiled) -> dict:
    """Graphs compiled and recompile reasons seen by this rank for this run."""
    if compiler == "ember":
        graphs, reasons, todo, seen = 0, [], [compiled._ember_cache], set()
        while todo:
            cache = todo.pop()
            if id(cache) in seen:
                continue
            seen.add(id(cache))
            for entry in cache.entries:
                g = entry.namespace.get("__graph")
                if g is not None:
                    graphs += getattr(g, "meta", {}).get("ember_split", {}).get("count", 1)
            reasons += [f"{cache.root.name}: {r}" for r in cache.recompile_reasons]
            todo += cache.break_context.caches()
        return dict(graphs=graphs, recompiles=len(reasons), recompile_reasons=sorted(reasons))
    if compiler == "torch":
        from torch._dynamo.utils import counters  # the peer's own counters (a benchmark may read them)
        reasons = sorted(f"{k}" for k in counters["recompiles"]) if "recompiles" in counters else []
        return dict(graphs=int(counters["stats"]["unique_graphs"]), recompiles=len(reasons),
                    recompile_reasons=reasons)
    return dict(graphs=0, recompiles=0, recompile_reasons=[])


def peak_memory(device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # process-wide high-water mark


def run_one(model_name, strategy, compiler, args, device, rank) -> dict:
    if compiler == "torch":
        torch._dynamo.reset()
        from torch._dynamo.utils import counters
        counters.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model, blocks, vocab, dtype = build_model(model_name, args.tiny)
    model = model.to(device)
    wrapped = wrap(strategy, LossOf(model) if strategy == "ddp" else model, blocks, device)
    if strategy == "fsdp2":
        wrapped = LossOf(wrapped)
    compiled = compile_with(compiler, wrapped, args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=device.type == "cuda")
    losses, times = [], []
    for step in range(args.steps):
        ids = batch(step, rank, vocab, args, device)
        sync(device)
        t0 = time.perf_counter()
        loss = compiled(ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach().float()))
    steady = times[min(3, len(times) - 1):]
    step_s = statistics.median(steady)
    out = dict(model=model_name, strategy=strategy, compiler=compiler, losses=losses,
               step_ms=1000 * step_s, first_step_s=times[0], cold_compile_s=max(0.0, times[0] - step_s),
               peak_memory_bytes=peak_memory(device), dtype=str(dtype).replace("torch.", ""),
               **graph_stats(compiler, compiled))
    if args.profile:
        out["profile"] = profile(compiled, opt, vocab, args, device, rank)
    del compiled, wrapped, model, opt
    return out


def profile(compiled, opt, vocab, args, device, rank) -> dict:
    """Overlap of communication with compute over a few profiled steps (see ``overlap``)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        for step in range(args.profile_steps):
            loss = compiled(batch(args.steps + step, rank, vocab, args, device))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path)).get("traceEvents", [])
    return overlap(events, gpu=device.type == "cuda")


def overlap(events: list, gpu: bool) -> dict:
    """Communication time, and the part of it that overlaps compute. On GPUs: device kernels
    (``nccl*`` kernels against all others). On CPU (gloo): communication calls against ATen ops
    on other threads (indicative only: gloo's work runs on its own threads)."""
    if gpu:
        spans = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    else:
        spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    comm = [(e["ts"], e["ts"] + e["dur"], e.get("tid")) for e in spans if COMM.search(e.get("name", ""))]
    compute = [(e["ts"], e["ts"] + e["dur"], e.get("tid")) for e in spans
               if not COMM.search(e.get("name", "")) and (gpu or e.get("name", "").startswith("aten::"))]
    merged = _union([(a, b) for a, b, _ in compute])
    comm_us = sum(b - a for a, b, _ in comm)
    overlapped = sum(_intersect(a, b, merged) for a, b, _ in comm)
    names: dict = {}
    for e in spans:
        if COMM.search(e.get("name", "")):
            key = e["name"][:60]
            names[key] = names.get(key, 0) + e["dur"]
    return dict(comm_ms=comm_us / 1000, comm_overlapped_ms=overlapped / 1000,
                overlap_fraction=(overlapped / comm_us) if comm_us else None,
                compute_ms=sum(b - a for a, b in merged) / 1000, comm_events=len(comm),
                top_comm=sorted(((k, v / 1000) for k, v in names.items()), key=lambda kv: -kv[1])[:5])


def _union(spans):
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _intersect(a, b, merged) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in merged if lo < b and hi > a)


# ---- ranks agree, with timeouts ------------------------------------------------------------------
def compare_ranks(per_rank: list) -> list:
    """Guard divergence: runs whose graph counts or recompile reasons differ between ranks."""
    problems = []
    for i, run in enumerate(per_rank[0]):
        views = [r[i] for r in per_rank]
        keys = {(v.get("graphs"), v.get("recompiles"), tuple(v.get("recompile_reasons", ()))) for v in views}
        errors = [v.get("error") for v in views if v.get("error")]
        if len(keys) > 1 or errors:
            problems.append(dict(run=f"{run['model']}/{run['strategy']}/{run['compiler']}",
                                 per_rank=[dict(rank=r, graphs=v.get("graphs"), recompiles=v.get("recompiles"),
                                                recompile_reasons=v.get("recompile_reasons"), error=v.get("error"))
                                           for r, v in enumerate(views)]))
    return problems


def attach_loss_comparison(runs: list) -> None:
    eager = {(r["model"], r["strategy"]): r for r in runs if r["compiler"] == "eager" and "losses" in r}
    for r in runs:
        ref = eager.get((r["model"], r["strategy"]))
        if ref is not None and "losses" in r and r is not ref:
            diffs = [abs(a - b) for a, b in zip(r["losses"], ref["losses"])]
            r["max_loss_diff_vs_eager"] = max(diffs) if diffs else None
            r["speedup_vs_eager"] = ref["step_ms"] / r["step_ms"] if r.get("step_ms") else None


def worker(rank: int, world: int, args) -> None:
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=args.collective_timeout)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                                timeout=timeout, **({"device_id": device} if device.type == "cuda" else {}))
    ctl = dist.new_group(backend="gloo", timeout=timeout)  # the script's own agreement: never NCCL
    runs = []
    for model_name in args.models:
        for strategy in args.strategies:
            for compiler in args.compilers:
                dist.monitored_barrier(group=ctl, timeout=timeout)
                try:
                    res = run_one(model_name, strategy, compiler, args, device, rank)
                except Exception as exc:  # reported; the other ranks learn of it below
                    res = dict(model=model_name, strategy=strategy, compiler=compiler,
                               error=f"{type(exc).__name__}: {exc}"[:2000], trace=traceback.format_exc()[-4000:])
                runs.append(res)
                if rank == 0:
                    print(summary_line(res), flush=True)
    dist.monitored_barrier(group=ctl, timeout=timeout)
    gathered = [None] * world
    dist.all_gather_object(gathered, runs, group=ctl)
    if rank == 0:
        for r in gathered:
            attach_loss_comparison(r)
        report = dict(machine=machine(device), world_size=world, device=args.device, tiny=args.tiny,
                      steps=args.steps, batch=args.batch, seq=args.seq, torch=torch.__version__,
                      per_rank=gathered, divergence=compare_ranks(gathered))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
        print_report(report)
        print(f"wrote {args.out}")
    dist.destroy_process_group()


def summary_line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:8} {r['strategy']:6} {r['compiler']:6} ERROR {r['error'][:200]}"
    return (f"{r['model']:8} {r['strategy']:6} {r['compiler']:6} step {r['step_ms']:9.2f} ms  cold compile "
            f"{r['cold_compile_s']:7.2f} s  peak {r['peak_memory_bytes'] / 2**20:8.1f} MiB  graphs {r['graphs']}  "
            f"recompiles {r['recompiles']}  loss {r['losses'][-1]:.4f}")


def print_report(report: dict) -> None:
    print("\nrank 0 (losses vs eager's, max |diff| over the steps):")
    for r in report["per_rank"][0]:
        if "error" in r:
            continue
        extra = ""
        if r.get("max_loss_diff_vs_eager") is not None:
            extra = f"  loss diff {r['max_loss_diff_vs_eager']:.2e}  x{r['speedup_vs_eager']:.2f} vs eager"
        if r.get("profile"):
            p = r["profile"]
            frac = p["overlap_fraction"]
            extra += f"  comm {p['comm_ms']:.1f} ms, overlapped {'-' if frac is None else f'{100 * frac:.0f}%'}"
        print(f"  {r['model']:8} {r['strategy']:6} {r['compiler']:6}{extra}")
    if report["divergence"]:
        print("GUARD DIVERGENCE / FAILURES ACROSS RANKS:")
        for d in report["divergence"]:
            print(f"  {d['run']}: " + "; ".join(
                f"rank {p['rank']}: graphs {p['graphs']}, recompiles {p['recompiles']}"
                + (f", error {p['error'][:120]}" if p["error"] else "")
                + (f", reasons {p['recompile_reasons'][:2]}" if p["recompile_reasons"] else "")
                for p in d["per_rank"]))
    else:
        print("ranks agree: same graphs and recompiles on every rank")


def machine(device) -> str:
    if device.type == "cuda":
        return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")
    return "cpu"


# ---- launching ----------------------------------------------------------------------------------
def _spawned(rank, world, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    worker(rank, world, args)


def launch(args) -> int:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(_spawned, args=(args.nproc, port, args), nprocs=args.nproc, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + args.timeout
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                print(f"distributed.py: the ranks did not finish within {args.timeout}s; killing them "
                      "(a hang: see the last runs printed above)", file=sys.stderr)
                for p in ctx.processes:
                    p.kill()
                return 2
    except Exception as exc:  # a rank died: ProcessRaisedException / ProcessExitedException
        print(f"distributed.py: a rank failed: {exc}", file=sys.stderr)
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
        return 1
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--nproc", type=int, default=None, help="ranks to spawn (default: GPUs, or 2 on CPU)")
    ap.add_argument("--tiny", action="store_true", help="tiny configs of both architectures (CPU checks)")
    ap.add_argument("--models", default="gpt2,llama1b")
    ap.add_argument("--strategies", default="ddp,fsdp2")
    ap.add_argument("--compilers", default="eager,ember,torch")
    ap.add_argument("--torch-backend", default="inductor", help="torch.compile's backend (aot_eager: no C++ build)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=None, help="sequences per rank (default 8, tiny 2)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 512, tiny 32)")
    ap.add_argument("--profile", action="store_true", help="profile a few extra steps per run (overlap summary)")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--inject-divergence", action="store_true",
                    help="rank 1 gets a longer batch at step 2: a recompile on one rank only (tests the report)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before the launcher kills the ranks")
    ap.add_argument("--collective-timeout", type=float, default=300, help="seconds for any collective")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    args.models, args.strategies, args.compilers = (s.split(",") for s in (args.models, args.strategies, args.compilers))
    args.batch = args.batch or (2 if args.tiny else 8)
    args.seq = args.seq or (32 if args.tiny else 512)
    if args.nproc is None:
        args.nproc = torch.cuda.device_count() if args.device == "cuda" else 2
    if args.out is None:
        name = "cpu" if args.device == "cpu" else re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
        runs = "-".join(args.models) + ("" if args.strategies == ["ddp", "fsdp2"] else "-" + "-".join(args.strategies))
        args.out = str(REPO / "benchmarks" / "results" / f"distributed-{name}-{runs}{'-tiny' if args.tiny else ''}.json")
    return args


if __name__ == "__main__":
    sys.exit(launch(parse_args()))
