"""Distributed training compiled by ember, by torch.compile, and eager (issue 31).

GPT-2 124M and a ~1.1B Llama-architecture model (transformers configs, random weights; Llama: 24
layers, hidden 2048, GQA 32/4 heads, SwiGLU 5632, vocabulary 32000, tied embeddings, in bf16)
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
    # two H100s, NCCL: both models, both strategies, all three compilers in one command; --budget
    # stops starting runs after 450 s (the runs left are recorded as skipped), --timeout kills a
    # straggler (each rank's finished runs are kept: the launcher writes them out)
    python benchmarks/distributed.py --device cuda --nproc 2 --models gpt2,llama1b --steps 20 --profile \
        --budget 450 --timeout 530
    # --paired: each model x strategy's three runs built side by side, each one's first steps (compile,
    # memory) taken alone, then their steady steps in turn (what the acceptance figures use: the host's
    # drift over minutes moved a sequential run's eager FSDP2 step between 98 and 134 ms)
    python benchmarks/distributed.py --device cuda --nproc 2 --paired --profile --budget 450 --timeout 530
    # --optim fused: AdamW's fused kernel instead of foreach (torchtitan's default)
    # --fresh-caches: ember/Triton/Inductor disk caches in a new folder (cold compiles on a machine
    # that ran before); --cprofile DIR: where rank 0's first compiled step spends its time, in the report
    # or under torchrun:
    torchrun --nproc_per_node 2 benchmarks/distributed.py --device cuda --steps 20

Results: ``benchmarks/results/distributed-<machine>-<models>.json`` (``--out`` to change).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
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
TINY_LAYERS = 4  # tiny configs: still several identical blocks (FSDP2 shards each; one compile serves all)


def build_model(name: str, tiny: bool, device):
    """(model, blocks to shard, vocab size, dtype), built on ``device`` in its dtype (a 1.1B model
    initialised on a CPU takes longer than its whole benchmark), weights from a fixed seed and then
    broadcast from rank 0 (equal on every rank)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if name == "gpt2":
        cfg = (GPT2Config(n_layer=TINY_LAYERS, n_embd=64, n_head=4, vocab_size=256, n_positions=128) if tiny
               else GPT2Config())
        cfg.attn_pdrop = cfg.embd_pdrop = cfg.resid_pdrop = 0.0  # dropout off: runs comparable step by step
        # fp32 weights, the step under bf16 autocast (gpu_suite's gpt2_train recipe, how GPT-2 is
        # trained in practice): "amp_bf16"; an fp32 step is bound by fp32 matmuls that no compiler speeds up
        cls, dtype = GPT2LMHeadModel, torch.float32
    elif name == "llama1b":
        # 1.1B parameters, 24 layers (TinyLlama-1.1B's widths, two more layers); tiny: the same architecture
        cfg = (LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=TINY_LAYERS, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=256, max_position_embeddings=128) if tiny else
               LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=32,
                           num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                           tie_word_embeddings=True, rope_theta=10000.0))
        cfg._attn_implementation = "sdpa"
        cls, dtype = LlamaForCausalLM, torch.bfloat16
    else:
        raise SystemExit(f"unknown model {name!r}: choose gpt2 or llama1b")
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(before)
    model.config.use_cache = False
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src=0)
    blocks = list(model.transformer.h) if name == "gpt2" else list(model.model.layers)
    return model, blocks, model.config.vocab_size, dtype


def autocast_of(model_name: str, args, device):
    """The forward's autocast context: bf16 autocast for GPT-2's fp32 weights unless ``--gpt2-fp32``."""
    if model_name == "gpt2" and not args.gpt2_fp32:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


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


def make_optimizer(params, args, device):
    """AdamW as the step's last phase, the same for every compiler (none of them compiles it).
    ``--optim foreach`` (default): one multi-tensor kernel per update term, a dozen ops dispatched per
    step (under FSDP2 each through DTensor's dispatcher); ``fused``: one fused kernel per step, the
    production recipe on GPUs (torchtitan's default), whose host cost is a fraction of foreach's."""
    optim = getattr(args, "optim", "foreach")
    if optim == "fused" and device.type == "cuda":
        return torch.optim.AdamW(params, lr=1e-4, fused=True)
    return torch.optim.AdamW(params, lr=1e-4, foreach=device.type == "cuda")


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


WARMUP_STEPS = 3  # steps before the steady ones whose median is the step time (the first one compiles)


class Run:
    """One run (model x strategy x compiler): built, stepped, then reported. ``run_one`` steps it alone;
    ``run_paired`` builds every compiler's run of a model x strategy, takes each one's first steps
    alone (compile, memory), then steps them in turn (one step of each, round after round), so that
    the host's drift over minutes (the same command's eager FSDP2 step has read 98 to 134 ms in
    different runs) hits every column alike."""

    def __init__(self, model_name, strategy, compiler, args, device, rank):
        self.model_name, self.strategy, self.compiler = model_name, strategy, compiler
        self.args, self.device, self.rank = args, device, rank
        if compiler == "torch":
            torch._dynamo.reset()
            from torch._dynamo.utils import counters
            counters.clear()
        self.base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0  # other runs' memory
        self.peak = 0
        self.ember_before = _ember_counters() if compiler == "ember" else None
        self.model, blocks, self.vocab, dtype = build_model(model_name, args.tiny, device)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        wrapped = wrap(strategy, LossOf(self.model) if strategy == "ddp" else self.model, blocks, device)
        if strategy == "fsdp2":
            wrapped = LossOf(wrapped)
        self.wrapped = wrapped
        self.compiled = compile_with(compiler, wrapped, args)
        self.opt = make_optimizer(self.model.parameters(), args, device)
        self.dtype = "amp_bf16" if not isinstance(self.amp(), contextlib.nullcontext) else dtype
        self.losses, self.times, self.cprofile_top = [], [], None

    def amp(self):
        return autocast_of(self.model_name, self.args, self.device)

    def step(self) -> None:
        """The next step (its batch is the step's index: every compiler sees the same data), timed
        from a synchronised device to a synchronised device; the peak memory it reached above what
        the other runs hold (``base``, taken when this run was built, when only they were resident)."""
        args, device, step = self.args, self.device, len(self.times)
        ids = batch(step, self.rank, self.vocab, args, device)
        sync(device)
        if device.type == "cuda":
            at_start = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        prof = _first_step_profiler(args, self.rank, step, self.compiler)
        t0 = time.perf_counter()
        with prof or contextlib.nullcontext():
            with self.amp():
                loss = self.compiled(ids)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            sync(device)
        self.times.append(time.perf_counter() - t0)
        if device.type == "cuda":  # this run's resident memory + what its step added on top
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(device) - self.base
                            if step == 0 else torch.cuda.max_memory_allocated(device) - at_start + self.resident)
            if step == 0:
                self.resident = torch.cuda.memory_allocated(device) - self.base
        if prof is not None:
            path = Path(args.cprofile) / f"{self.model_name}-{self.strategy}-{self.compiler}-rank{self.rank}.prof"
            path.parent.mkdir(parents=True, exist_ok=True)
            prof.dump_stats(str(path))
            self.cprofile_top = _profile_summary(str(path))
        self.losses.append(float(loss.detach().float()))

    def report(self) -> dict:
        times = self.times
        steady = times[min(WARMUP_STEPS, len(times) - 1):]
        step_s = statistics.median(steady)
        peak = self.peak if self.device.type == "cuda" else peak_memory(self.device)
        out = dict(model=self.model_name, strategy=self.strategy, compiler=self.compiler, losses=self.losses,
                   step_ms=1000 * step_s, first_step_s=times[0], cold_compile_s=max(0.0, times[0] - step_s),
                   peak_memory_bytes=int(peak), dtype=str(self.dtype).replace("torch.", ""),
                   parameters=self.n_params, **graph_stats(self.compiler, self.compiled))
        if self.cprofile_top is not None:
            out["cprofile_first_step"] = self.cprofile_top
        if self.ember_before is not None:  # what ember's own counters saw (divergence: ember.config.distributed_check)
            out["ember_counters"] = {k: v for k, v in (_ember_counters() - self.ember_before).items() if v}
        if self.args.profile:
            out["profile"] = profile(self.compiled, self.opt, self.vocab, self.args, self.device, self.rank, self.amp)
        return out

    def close(self) -> None:
        del self.compiled, self.wrapped, self.model, self.opt
        if self.compiler == "ember":
            import ember
            ember.reset()  # its caches hold the model's modules (guards): let them go with the run


def _fresh_memory(device) -> None:
    gc.collect()  # the previous run's model and caches (cycles) go before the next one measures memory
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_one(model_name, strategy, compiler, args, device, rank) -> dict:
    _fresh_memory(device)
    run = Run(model_name, strategy, compiler, args, device, rank)
    try:
        for _ in range(args.steps):
            run.step()
        return run.report()
    finally:
        run.close()


def run_paired(model_name, strategy, compilers, args, device, rank, failed) -> list:
    """Every compiler's run of one model x strategy, stepped in turn after their first steps (see
    ``Run``). ``failed(compiler, exc)`` makes the report of a run that raised; the others go on."""
    _fresh_memory(device)
    runs, results = {}, {}
    for compiler in compilers:
        try:
            run = runs[compiler] = Run(model_name, strategy, compiler, args, device, rank)
            for _ in range(min(WARMUP_STEPS, args.steps)):
                run.step()
        except Exception as exc:  # noqa: BLE001 - reported like a sequential run's failure
            results[compiler] = failed(compiler, exc)
            runs.pop(compiler, None)
    for _ in range(WARMUP_STEPS, args.steps):
        for compiler, run in list(runs.items()):
            try:
                run.step()
            except Exception as exc:  # noqa: BLE001
                results[compiler] = failed(compiler, exc)
                runs.pop(compiler).close()
    for compiler, run in runs.items():
        try:
            results[compiler] = run.report()
        except Exception as exc:  # noqa: BLE001
            results[compiler] = failed(compiler, exc)
    for run in runs.values():
        run.close()
    return [results[c] for c in compilers]


def _first_step_profiler(args, rank: int, step: int, compiler: str):
    """A cProfile.Profile for rank 0's first step of a compiled run (``--cprofile DIR``: where the cold
    compile's time goes; written as DIR/<model>-<strategy>-<compiler>-rank0.prof), else None."""
    if not args.cprofile or rank != 0 or step != 0 or compiler == "eager":
        return None
    import cProfile
    return cProfile.Profile()


def _profile_summary(path: str, rows: int = 40) -> dict:
    """The first step's profile in the report (the .prof file stays on the machine that ran it):
    functions by cumulative and by own time, as 'seconds calls file:line(function)'."""
    import pstats

    stats = pstats.Stats(path).stats  # {(file, line, fn): (prim calls, calls, tottime, cumtime, callers)}

    def rows_by(index):
        top = sorted(stats.items(), key=lambda kv: -kv[1][index])[:rows]
        return [f"{v[index]:.3f} {v[1]} {os.path.relpath(k[0], REPO) if k[0].startswith(str(REPO)) else k[0].split('site-packages/')[-1]}"
                f":{k[1]}({k[2]})" for k, v in top]
    return dict(cumulative=rows_by(3), own=rows_by(2))


def _ember_counters():
    import collections

    from ember.backends import regional
    from ember.diagnostics import counters
    shared = collections.Counter({f"regional_{k}": v for k, v in regional.stats().items()})  # blocks compiled once
    return counters.compiled_snapshot() + counters.snapshot() + shared


def profile(compiled, opt, vocab, args, device, rank, amp=contextlib.nullcontext) -> dict:
    """Overlap of communication with compute over a few profiled steps (see ``overlap``)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        for step in range(args.profile_steps):
            with amp():
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
    kernels: dict = {}  # compute kernels by name: where a step's device time goes
    for e in spans:
        if not COMM.search(e.get("name", "")) and (gpu or e.get("name", "").startswith("aten::")):
            k = kernels.setdefault(e["name"][:80], [0.0, 0])
            k[0] += e["dur"]
            k[1] += 1
    return dict(comm_ms=comm_us / 1000, comm_overlapped_ms=overlapped / 1000,
                overlap_fraction=(overlapped / comm_us) if comm_us else None,
                compute_ms=sum(b - a for a, b in merged) / 1000, comm_events=len(comm),
                top_comm=sorted(((k, v / 1000) for k, v in names.items()), key=lambda kv: -kv[1])[:5],
                top_compute=[(k, round(v[0] / 1000, 3), v[1]) for k, v in
                             sorted(kernels.items(), key=lambda kv: -kv[1][0])[:15]])


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
        if "skipped" in run or any(len(r) <= i for r in per_rank):
            continue
        views = [r[i] for r in per_rank]
        keys = {(v.get("graphs"), v.get("recompiles"), tuple(v.get("recompile_reasons", ()))) for v in views}
        errors = [v.get("error") for v in views if v.get("error")]
        if len(keys) > 1 or errors:
            problems.append(dict(run=f"{run['model']}/{run['strategy']}/{run['compiler']}",
                                 per_rank=[dict(rank=r, graphs=v.get("graphs"), recompiles=v.get("recompiles"),
                                                recompile_reasons=v.get("recompile_reasons"), error=v.get("error"))
                                           for r, v in enumerate(views)]))
    return problems


# relative loss tolerance against eager's, per dtype. AdamW's first steps move every parameter by
# about +-lr whatever its gradient's size, so a gradient that is zero up to rounding (fused kernels
# sum in another order) can move either way: a few 1e-4 of the loss after 5 steps of a tiny fp32 model
# (also with the code before issue 31's changes); bf16 rounds every op's result on top of that
LOSS_RTOL = {"float32": 1e-3, "bfloat16": 2e-2, "amp_bf16": 2e-2}


def attach_loss_comparison(runs: list) -> None:
    eager = {(r["model"], r["strategy"]): r for r in runs if r["compiler"] == "eager" and "losses" in r}
    torch_runs = {(r["model"], r["strategy"]): r for r in runs if r["compiler"] == "torch" and "step_ms" in r}
    for r in runs:
        ref = eager.get((r["model"], r["strategy"]))
        if ref is not None and "losses" in r and r is not ref:
            diffs = [abs(a - b) / max(abs(b), 1e-6) for a, b in zip(r["losses"], ref["losses"])]
            r["max_loss_diff_vs_eager"] = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"])) if diffs else None
            r["max_loss_rel_diff_vs_eager"] = max(diffs) if diffs else None
            r["losses_match_eager"] = bool(diffs) and max(diffs) <= LOSS_RTOL.get(r.get("dtype"), 1e-4)
            r["speedup_vs_eager"] = ref["step_ms"] / r["step_ms"] if r.get("step_ms") else None
            if "cold_compile_s" in r and "cold_compile_s" in ref:  # the first step's excess that eager has too
                # (FSDP2's lazy init, the allocator growing, a first collective) left out: what compiling added
                r["compile_beyond_eager_s"] = max(0.0, r["cold_compile_s"] - ref["cold_compile_s"])
    for r in runs:  # (after every run's own figures: the torch run may come after ember's)
        peer = torch_runs.get((r["model"], r["strategy"]))
        if r["compiler"] == "ember" and peer is not None and r.get("step_ms"):
            r["speedup_vs_torch_compile"] = peer["step_ms"] / r["step_ms"]
            if peer.get("cold_compile_s"):
                r["compile_time_vs_torch_compile"] = r["cold_compile_s"] / peer["cold_compile_s"]
            if peer.get("compile_beyond_eager_s") and "compile_beyond_eager_s" in r:
                r["compile_beyond_eager_vs_torch_compile"] = r["compile_beyond_eager_s"] / peer["compile_beyond_eager_s"]


def worker(rank: int, world: int, args) -> None:
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # as gpu_suite: fp32 matmuls outside autocast on tensor cores
        torch.backends.cudnn.allow_tf32 = True
    timeout = datetime.timedelta(seconds=args.collective_timeout)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                                timeout=timeout, **({"device_id": device} if device.type == "cuda" else {}))
    ctl = dist.new_group(backend="gloo", timeout=timeout)  # the script's own agreement: never NCCL
    import ember
    ember.config.distributed_check = args.distributed_check  # a rank that compiles differently: reported
    runs = []
    started = time.monotonic()
    def failed(model_name, strategy, compiler, exc):  # reported; the other ranks learn of it below
        return dict(model=model_name, strategy=strategy, compiler=compiler,
                    error=f"{type(exc).__name__}: {exc}"[:2000], trace=traceback.format_exc()[-4000:])

    def keep(res):
        runs.append(res)
        Path(partial_path(args.out, rank)).write_text(json.dumps(runs))  # kept if the launcher kills us
        if rank == 0:
            print(summary_line(res), flush=True)

    # sequential: one run at a time; --paired: the compilers of one model x strategy side by side
    groups = [(m, s, [c] if not args.paired else args.compilers) for m in args.models for s in args.strategies
              for c in (args.compilers if not args.paired else [None])]
    for model_name, strategy, compilers in groups:
        dist.monitored_barrier(group=ctl, timeout=timeout)
        go = [args.budget is None or time.monotonic() - started < args.budget]
        dist.broadcast_object_list(go, src=0, group=ctl)  # rank 0's clock decides for all
        if not go[0]:
            for compiler in compilers:
                keep(dict(model=model_name, strategy=strategy, compiler=compiler,
                          skipped=f"--budget {args.budget:.0f} s spent before this run"))
            continue
        if args.paired:
            for res in run_paired(model_name, strategy, compilers, args, device, rank,
                                  lambda c, exc: failed(model_name, strategy, c, exc)):
                keep(res)
            continue
        try:
            res = run_one(model_name, strategy, compilers[0], args, device, rank)
        except Exception as exc:
            res = failed(model_name, strategy, compilers[0], exc)
        keep(res)
    dist.monitored_barrier(group=ctl, timeout=timeout)
    gathered = [None] * world
    dist.all_gather_object(gathered, runs, group=ctl)
    if rank == 0:
        report = make_report(gathered, args, machine(device), world)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
        print_report(report)
        print(f"wrote {args.out}")
    dist.monitored_barrier(group=ctl, timeout=timeout)
    Path(partial_path(args.out, rank)).unlink(missing_ok=True)
    dist.destroy_process_group()


def partial_path(out: str, rank: int) -> str:
    return f"{out}.rank{rank}.partial"


def make_report(gathered: list, args, machine_name: str, world: int, complete: bool = True) -> dict:
    for r in gathered:
        attach_loss_comparison(r)
    return dict(machine=machine_name, world_size=world, device=args.device, tiny=args.tiny, complete=complete,
                steps=args.steps, batch=args.batch, seq=args.seq, optim=getattr(args, "optim", "foreach"),
                paired=getattr(args, "paired", False),
                torch=torch.__version__,
                command=" ".join(sys.argv), per_rank=gathered, divergence=compare_ranks(gathered))


def summary_line(r: dict) -> str:
    if "skipped" in r:
        return f"{r['model']:8} {r['strategy']:6} {r['compiler']:6} SKIPPED ({r['skipped']})"
    if "error" in r:
        return f"{r['model']:8} {r['strategy']:6} {r['compiler']:6} ERROR {r['error'][:200]}"
    return (f"{r['model']:8} {r['strategy']:6} {r['compiler']:6} step {r['step_ms']:9.2f} ms  cold compile "
            f"{r['cold_compile_s']:7.2f} s  peak {r['peak_memory_bytes'] / 2**20:8.1f} MiB  graphs {r['graphs']}  "
            f"recompiles {r['recompiles']}  loss {r['losses'][-1]:.4f}")


def print_report(report: dict) -> None:
    print("\nrank 0 (losses vs eager's, max |diff| over the steps):")
    for r in report["per_rank"][0]:
        if "error" in r or "skipped" in r:
            continue
        extra = ""
        if r.get("max_loss_diff_vs_eager") is not None:
            extra = (f"  loss diff {r['max_loss_diff_vs_eager']:.2e} ({'match' if r['losses_match_eager'] else 'DIFFER'})"
                     f"  x{r['speedup_vs_eager']:.2f} vs eager")
        if r.get("speedup_vs_torch_compile") is not None:
            extra += f"  x{r['speedup_vs_torch_compile']:.2f} vs torch.compile"
            if r.get("compile_time_vs_torch_compile") is not None:
                extra += f", compile {r['compile_time_vs_torch_compile']:.2f} of torch.compile's"
                if r.get("compile_beyond_eager_vs_torch_compile") is not None:
                    extra += f" ({r['compile_beyond_eager_vs_torch_compile']:.2f} beyond eager's first step)"
        if r.get("profile"):
            p = r["profile"]
            frac = p["overlap_fraction"]
            extra += f"  comm {p['comm_ms']:.1f} ms, overlapped {'-' if frac is None else f'{100 * frac:.0f}%'}"
        print(f"  {r['model']:8} {r['strategy']:6} {r['compiler']:6}{extra}")
    print("cold compile per rank (s): " + "; ".join(
        f"{run['model']}/{run['strategy']}/{run['compiler']} "
        + "/".join(f"{v[i].get('cold_compile_s', float('nan')):.1f}" for v in report["per_rank"] if len(v) > i)
        for i, run in enumerate(report["per_rank"][0]) if run["compiler"] != "eager" and "step_ms" in run))
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


def fresh_caches() -> str:
    """Point ember's, Triton's and Inductor's on-disk caches at a new empty folder (the ranks inherit
    the environment): the first compile of each graph in this job is cold for both compilers, whatever
    an earlier job left on this machine. Runs within the job still share them (the DDP runs come first)."""
    tmp = tempfile.mkdtemp(prefix="distributed-caches-")
    os.environ.update(EMBER_CACHE_DIR=os.path.join(tmp, "ember"), TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
                      TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"))
    return tmp


def launch(args) -> int:
    if args.fresh_caches:
        print(f"distributed.py: fresh compile caches under {fresh_caches()}", flush=True)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    import torch.multiprocessing as mp
    # as torchrun (the ranks inherit it): one intra-op thread per rank unless the caller chose. Small
    # models' steps are bound by the host, and the one difference between this launcher's ranks and
    # torchrun's is this setting (GPT-2 FSDP2's eager step read 134-148 ms spawned here in s38/s43,
    # 98 ms under torchrun in fsdp_host.py)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
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
                salvage(args)
                return 2
    except Exception as exc:  # a rank died: ProcessRaisedException / ProcessExitedException
        print(f"distributed.py: a rank failed: {exc}", file=sys.stderr)
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
        salvage(args)
        return 1
    return 0


def salvage(args) -> None:
    """The ranks were killed: write the runs each had finished (marked incomplete)."""
    parts = [Path(partial_path(args.out, r)) for r in range(args.nproc)]
    gathered = [json.loads(p.read_text()) if p.exists() else [] for p in parts]
    if not any(gathered):
        return
    name = "cpu" if args.device == "cpu" else re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
    report = make_report(gathered, args, name, args.nproc, complete=False)
    Path(args.out).write_text(json.dumps(report, indent=1))
    for p in parts:
        p.unlink(missing_ok=True)
    print_report(report)
    print(f"wrote {args.out} (incomplete: the runs the ranks had finished)")


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
    ap.add_argument("--paired", action="store_true",
                    help="the compilers of each model x strategy stepped in turn after their first steps (step "
                         "times that the host's drift over minutes hits alike; all of them in memory at once)")
    ap.add_argument("--optim", choices=["foreach", "fused"], default="foreach",
                    help="AdamW's implementation on GPUs (fused: one kernel per step; CPU runs use the default)")
    ap.add_argument("--batch", type=int, default=None, help="sequences per rank (default 8, tiny 2)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 512, tiny 32)")
    ap.add_argument("--profile", action="store_true", help="profile a few extra steps per run (overlap summary)")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--gpt2-fp32", action="store_true", help="GPT-2's step in fp32 (default: bf16 autocast)")
    ap.add_argument("--inject-divergence", action="store_true",
                    help="rank 1 gets a longer batch at step 2: a recompile on one rank only (tests the report)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before the launcher kills the ranks")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds after which no further run starts (the rest are recorded as skipped)")
    ap.add_argument("--distributed-check", default="warn", choices=["off", "warn", "raise"],
                    help="ember.config.distributed_check for the ember runs (guard divergence across ranks)")
    ap.add_argument("--collective-timeout", type=float, default=300, help="seconds for any collective")
    ap.add_argument("--cprofile", default=None, metavar="DIR",
                    help="dump a cProfile of rank 0's first step of each compiled run into DIR (cold compile; "
                         "off by default; the profiler slows that step)")
    ap.add_argument("--fresh-caches", action="store_true",
                    help="ember, Triton and Inductor caches in a new empty folder for this job (cold compiles)")
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
