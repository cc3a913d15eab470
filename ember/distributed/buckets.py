"""The ``ddp_buckets`` pass: split a captured FX graph at DistributedDataParallel's bucket boundaries.

Why: the autograd layer runs one compiled graph's backward as one node of the autograd graph, so
every parameter's gradient of that graph becomes ready at its very end, and DDP can start no
all-reduce until the whole backward is done. Split into parts, each part's backward ends on its
own; DDP's reducer then launches a bucket's all-reduce as soon as the part holding its parameters
has finished, while the backward of the earlier parts runs (torch.compile's ``DDPOptimizer``).

How the parts are chosen, as DDP fills its buckets: parameters in reverse order of use (the order
their gradients become ready), a new bucket once the current one holds ``bucket_bytes_cap`` bytes
(the first one: ``first_bucket_bytes_cap``). Walking the graph's ops from the last to the first, each op
joins the current part, and the parameters it reads (graph inputs that are parameters DDP reduces)
count towards it the first time they are seen; a full part is closed only once one of its values is
used outside it, so no part is dead code.

Each part is compiled by the backend on its first call, with the real tensors it receives then (the
inputs a backend expects; working them out ahead would mean running the graph once more). The split
GraphModule, readable with ``print(split.code)``, calls the parts in order.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from ember.config import config
from ember.diagnostics import logging as elog
from ember.locks import COMPILE_LOCK

PASS_NAME = "ddp_buckets"


def active_ddp_module():
    """The DistributedDataParallel whose forward is running now (DDP records it while it calls the
    module it wraps), else None."""
    ddp_cls = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    return getattr(ddp_cls, "_active_ddp_module", None) if ddp_cls is not None else None


def with_ddp_buckets(compiler):
    """``compiler`` (a backend ``fn(gm, example_inputs)``) with the ``ddp_buckets`` pass in front: a
    graph compiled inside a DDP forward is split at its buckets and each part compiled by
    ``compiler``; other graphs go to ``compiler`` unchanged."""
    @functools.wraps(compiler)
    def backend(gm, example_inputs):
        ddp = active_ddp_module() if config.optimize_ddp else None
        if ddp is None:
            return compiler(gm, example_inputs)
        # a graph of repeated blocks: split at the blocks, each compiled once (backends/regional.py)
        regions = getattr(compiler, "ember_ddp_regions", None)
        split = regions(gm, example_inputs) if regions is not None else None
        if split is not None:
            return split
        split = split_at_buckets(gm, example_inputs, ddp, compiler)
        return split if split is not None else compiler(gm, example_inputs)

    for attr in ("ember_backend_name", "prewarm", "prewarm_trace"):
        if hasattr(compiler, attr):
            setattr(backend, attr, getattr(compiler, attr))
    return backend


@dataclass
class Bucket:
    nodes: list = field(default_factory=list)   # ops, last first
    params: list = field(default_factory=list)  # parameter names, in the order DDP's gradients come
    nbytes: int = 0


def _caps(ddp) -> tuple[int, int]:
    """(first bucket's cap, later buckets' cap) in bytes, as this DDP instance fills its buckets."""
    cap = int(ddp.bucket_bytes_cap)
    cfg = getattr(ddp, "_bucket_config", None)
    first = getattr(cfg, "first_bucket_bytes_cap", None)
    return (int(first) if first is not None else cap), cap


def _reduced_params(ddp) -> dict:
    """id(parameter) -> name, for the parameters DDP all-reduces (needing a gradient, not ignored)."""
    ignored = getattr(ddp, "parameters_to_ignore", set())
    return {id(p): name for name, p in ddp.module.named_parameters()
            if p.requires_grad and name not in ignored}


def plan_buckets(gm: fx.GraphModule, example_inputs: list, ddp) -> list[Bucket]:
    """The parts of ``gm``, first (earliest in the forward) to last."""
    reduced = _reduced_params(ddp)
    param_of: dict = {}  # placeholder node -> (name, bytes)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, example_inputs):
        if isinstance(value, torch.Tensor) and id(value) in reduced:
            param_of[node] = (reduced[id(value)], value.numel() * value.element_size())
    first_cap, cap = _caps(ddp)
    buckets = [Bucket()]
    members: set = set()    # nodes of the bucket being filled
    counted: set = set()
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        current = buckets[0]
        limit = first_cap if len(buckets) == 1 else cap
        if current.nbytes >= limit and any(u not in members for n in current.nodes for u in n.users):
            buckets.insert(0, Bucket())
            current, members = buckets[0], set()
        current.nodes.append(node)
        members.add(node)
        for inp in node.all_input_nodes:
            if inp in param_of and inp not in counted:
                counted.add(inp)
                name, nbytes = param_of[inp]
                current.params.append(name)
                current.nbytes += nbytes
    buckets = [b for b in buckets if b.nodes]
    if len(buckets) > 1 and not buckets[0].params:  # ops before the first parameter: no bucket of their own
        first = buckets.pop(0)
        buckets[0].nodes += first.nodes
    return buckets


def split_at_buckets(gm: fx.GraphModule, example_inputs: list, ddp, compiler):
    """The split GraphModule whose parts ``compiler`` compiles, or None when the graph fits in one
    bucket (nothing to gain)."""
    buckets = plan_buckets(gm, example_inputs, ddp)
    if len(buckets) < 2:
        return None
    part_of = {node: i for i, b in enumerate(buckets) for node in b.nodes}
    split = split_module(gm, gm, lambda node: part_of[node], keep_original_order=True)
    first_cap, cap = _caps(ddp)
    names = sorted((n for n, _ in split.named_children()), key=lambda s: int(s.rsplit("_", 1)[1]))
    for name in names:
        index = int(name.rsplit("_", 1)[1])
        part: fx.GraphModule = getattr(split, name)
        b = buckets[index]
        part.meta["ember_split"] = dict(pass_name=PASS_NAME, index=index, count=len(buckets),
                                        params=list(b.params), param_bytes=b.nbytes,
                                        bucket_bytes_cap=cap, first_bucket_bytes_cap=first_cap,
                                        parent=id(gm))
        setattr(split, name, CompiledPart(part, compiler))
    split.meta["ember_split"] = dict(pass_name=PASS_NAME, count=len(buckets), parent=id(gm))
    elog.artifact("graph_code", f"{PASS_NAME}: graph split into {len(buckets)} parts at DDP's buckets "
                                f"(bucket_bytes_cap={cap}, first_bucket_bytes_cap={first_cap}); "
                                f"parameters per part: {[len(b.params) for b in buckets]}\n{split.code}")
    return split


class CompiledPart(torch.nn.Module):
    """One part of a split graph: compiled by the backend at its first call, with that call's inputs."""

    def __init__(self, gm: fx.GraphModule, compiler):
        super().__init__()
        self.gm = gm
        self.compiler = compiler
        self.fn = None

    def forward(self, *args):
        fn = self.fn
        if fn is None:
            with COMPILE_LOCK:  # another thread may have compiled it meanwhile
                if self.fn is None:
                    compiled = self.compiler(self.gm, list(args))
                    self.fn = compiled if compiled is not None else self.gm.forward
                fn = self.fn
        return fn(*args)
