"""One rank of the gloo DDP/FSDP2 checks of test_ddp.py (run as a script: ``python ddp_worker.py RANK
WORLD PORT OUT_DIR``). Each scenario trains a compiled copy and an eager copy of the same model, from the
same weights, on the same data, and records losses, gradients and how many graphs were compiled."""
from __future__ import annotations

import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ember

STEPS = 5
WIDTH = 16
LINEAR_BYTES = (WIDTH * WIDTH + WIDTH) * 4  # 1088: one Linear's parameters
CAP_MB = 1000 / 2**20                       # < one Linear: each Linear fills a bucket of its own


def mlp(layers: int = 5) -> torch.nn.Sequential:
    torch.manual_seed(0)
    mods = []
    for i in range(layers):
        mods += [torch.nn.Linear(WIDTH, WIDTH)] + ([torch.nn.ReLU()] if i < layers - 1 else [])
    return torch.nn.Sequential(*mods)


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(100 * step + rank))


def train(run, params, steps=STEPS):
    """run(x) -> loss; returns (losses, per-step gradients) with SGD steps in between."""
    opt = torch.optim.SGD(params, lr=0.05)
    losses, grads = [], []
    for step in range(steps):
        loss = run(batch(step, dist.get_rank()))
        loss.backward()
        losses.append(loss.item())
        grads.append([_full(p.grad).clone() for p in params])
        opt.step()
        opt.zero_grad()
    return losses, grads


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def parts_of(compiled_module) -> list:
    """The graphs the compiled module's caches hold, as (parts per graph) counts."""
    out = []
    todo, seen = [compiled_module._ember_cache], set()
    while todo:
        cache = todo.pop()
        if id(cache) in seen:
            continue
        seen.add(id(cache))
        for entry in cache.entries:
            g = entry.namespace.get("__graph")
            if g is not None:
                out.append(getattr(g, "meta", {}).get("ember_split", {}).get("count", 1))
        todo += cache.break_context.caches()
    return out


def scenario_outer(backend):
    """ember.compile(DDP(model)) vs DDP(model)."""
    model, ref = mlp(), mlp()
    compiled = ember.compile(DDP(model, bucket_cap_mb=CAP_MB), backend=backend)
    ref_ddp = DDP(ref, bucket_cap_mb=CAP_MB)
    got = train(lambda x: compiled(x).pow(2).mean(), list(model.parameters()))
    want = train(lambda x: ref_ddp(x).pow(2).mean(), list(ref.parameters()))
    return dict(got=got, want=want, parts=parts_of(compiled))


def scenario_inner(backend):
    """DDP(ember.compile(model)) vs DDP(model)."""
    model, ref = mlp(), mlp()
    compiled = ember.compile(model, backend=backend)
    ddp = DDP(compiled, bucket_cap_mb=CAP_MB)
    ref_ddp = DDP(ref, bucket_cap_mb=CAP_MB)
    got = train(lambda x: ddp(x).pow(2).mean(), list(model.parameters()))
    want = train(lambda x: ref_ddp(x).pow(2).mean(), list(ref.parameters()))
    return dict(got=got, want=want, parts=parts_of(compiled))


def scenario_nested(backend):
    """A compiled training step that calls a DDP module: a break at the call, the module compiled."""
    model, ref = mlp(), mlp()
    ddp, ref_ddp = DDP(model, bucket_cap_mb=CAP_MB), DDP(ref, bucket_cap_mb=CAP_MB)
    step = ember.compile(lambda x: ddp(x).pow(2).mean(), backend=backend)
    got = train(step, list(model.parameters()))
    want = train(lambda x: ref_ddp(x).pow(2).mean(), list(ref.parameters()))
    return dict(got=got, want=want, parts=parts_of(step))


def scenario_no_split(backend):
    """ember.config.optimize_ddp off: one graph."""
    ember.config.optimize_ddp = False
    try:
        model = mlp()
        compiled = ember.compile(DDP(model, bucket_cap_mb=CAP_MB), backend=backend)
        got = train(lambda x: compiled(x).pow(2).mean(), list(model.parameters()), steps=1)
    finally:
        ember.config.optimize_ddp = True
    return dict(got=got, parts=parts_of(compiled))


def scenario_explain(backend):
    report = ember.explain(DDP(mlp(), bucket_cap_mb=CAP_MB))(batch(0, dist.get_rank()))
    report.out.sum().backward()  # DDP expects the backward of a forward run with gradients
    return dict(text=str(report), graphs=report.graph_count, split=report.split_graph_count)


def scenario_fsdp2(backend):
    """fully_shard on each Linear and the root, ember.compile(root) vs the same sharding eager."""
    from torch.distributed.fsdp import fully_shard

    model, ref = mlp(), mlp()
    for m in (model, ref):
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(m)
    compiled = ember.compile(model, backend=backend)
    got = train(lambda x: compiled(x).pow(2).mean(), list(model.parameters()))
    want = train(lambda x: ref(x).pow(2).mean(), list(ref.parameters()))
    return dict(got=got, want=want, parts=parts_of(compiled))


class LoopBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.lin = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + torch.tanh(self.lin(self.norm(x)))


class LoopModel(torch.nn.Module):
    """A transformer's shape: ``for block in self.h`` over identical blocks, each fully_shard-ed."""

    def __init__(self, blocks: int):
        super().__init__()
        torch.manual_seed(0)
        self.h = torch.nn.ModuleList([LoopBlock() for _ in range(blocks)])

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x


LOOP_BLOCKS = 12


class StemLoopModel(LoopModel):
    """A Linear stem and then the blocks: as in a transformer (the embedding first), every block's
    input requires grad, so one compiled block serves all (the first block's input otherwise would not)."""

    def __init__(self, blocks: int):
        super().__init__(blocks)
        self.stem = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return super().forward(self.stem(x))


def scenario_fsdp2_loop(backend):
    """12 fully_shard-ed blocks called in a loop (FSDP2's hooks on every block make each call a
    break): the loop body and the blocks' forward are compiled once, not once per block."""
    from torch.distributed.fsdp import fully_shard

    from ember.diagnostics import counters

    model, ref = LoopModel(LOOP_BLOCKS), LoopModel(LOOP_BLOCKS)
    for m in (model, ref):
        for block in m.h:
            fully_shard(block)
        fully_shard(m)
    compiled = ember.compile(model, backend=backend)
    before, fallbacks = counters.compiled_snapshot(), counters.fallbacks()
    got = train(lambda x: compiled(x).pow(2).mean(), list(model.parameters()))
    compiles = counters.compiled_snapshot() - before
    want = train(lambda x: ref(x).pow(2).mean(), list(ref.parameters()))
    caches = _caches(compiled)
    return dict(got=got, want=want, parts=parts_of(compiled), compiles=dict(compiles),
                fallbacks=counters.fallbacks() - fallbacks,
                entries={c.root.name: len(c.entries) for c in caches if c.entries},
                reasons=[r for c in caches for r in c.recompile_reasons])


def scenario_ddp_blocks(backend, regional_ddp=True, optimize_ddp=True):
    """ember.compile(DDP(model)) over 12 identical blocks (issue 31): split at the blocks, one block
    compiled and shared by the twelve (``regional_ddp`` off: split at DDP's buckets, every block
    compiled). Gradients equal eager DDP's."""
    from ember.backends import regional

    model, ref = StemLoopModel(LOOP_BLOCKS), StemLoopModel(LOOP_BLOCKS)
    ember.config.regional_ddp, ember.config.optimize_ddp = regional_ddp, optimize_ddp
    try:
        before = regional.stats()
        ddp = DDP(model, bucket_cap_mb=CAP_MB)
        events = _record_bucket_launches(ddp, model.stem.weight)
        compiled = ember.compile(ddp, backend=backend)
        ref_ddp = DDP(ref, bucket_cap_mb=CAP_MB)

        def step(x):
            events.append("forward")
            return compiled(x).pow(2).mean()
        got = train(step, list(model.parameters()))
        stats = dict(regional.stats() - before)
    finally:
        ember.config.regional_ddp = ember.config.optimize_ddp = True
    want = train(lambda x: ref_ddp(x).pow(2).mean(), list(ref.parameters()))
    last = events[len(events) - events[::-1].index("forward"):]  # the last step's backward
    return dict(got=got, want=want, parts=parts_of(compiled), regional=stats,
                buckets=last.count("bucket"), buckets_before_stem=last[:last.index("stem")].count("bucket"),
                split_by=sorted({getattr(e.namespace.get("__graph"), "meta", {}).get("ember_split", {}).get("pass_name")
                                 for c in _caches(compiled) for e in c.entries if e.namespace.get("__graph") is not None},
                                key=str))


def _record_bucket_launches(ddp, stem_weight) -> list:
    """A list that gets "bucket" each time DDP launches a bucket's all-reduce (DDP's own averaging
    all-reduce, through a comm hook) and "stem" when the backward reaches the stem, the model's first
    layer: buckets launched before "stem" overlap the rest of the backward."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    events: list = []

    def hook(state, bucket):
        events.append("bucket")
        return default_hooks.allreduce_hook(state, bucket)
    ddp.register_comm_hook(None, hook)
    stem_weight.register_hook(lambda g: events.append("stem"))
    return events


def _caches(compiled_module) -> list:
    out, todo, seen = [], [compiled_module._ember_cache], set()
    while todo:
        cache = todo.pop()
        if id(cache) not in seen:
            seen.add(id(cache))
            out.append(cache)
            todo += cache.break_context.caches()
    return out


SCENARIOS = {"fsdp2_loop": scenario_fsdp2_loop, "outer": scenario_outer, "inner": scenario_inner, "nested": scenario_nested,
             "no_split": scenario_no_split, "ddp_blocks": scenario_ddp_blocks,
             "ddp_blocks_off": lambda backend: scenario_ddp_blocks(backend, regional_ddp=False),
             "ddp_blocks_whole": lambda backend: scenario_ddp_blocks(backend, optimize_ddp=False), "explain": scenario_explain, "fsdp2": scenario_fsdp2}


def main(rank: int, world: int, port: int, out_dir: str, names: list, backend: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    try:
        for name in names:
            results[name] = SCENARIOS[name](backend)
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


if __name__ == "__main__":
    r, w, p, out, names, backend = sys.argv[1:7]
    main(int(r), int(w), int(p), out, names.split(","), backend)
