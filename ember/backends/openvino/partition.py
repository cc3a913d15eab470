"""Split an ATen graph into OpenVINO partitions and PyTorch ops, and build the runnable result.

    copy graph -> sizes from the inputs (dynamic shapes) -> propose partitions (support.py rules)
               -> fuse each into a submodule
               -> per partition: bake constants, convert + compile (convert.py), or fall back
               -> the parent graph calls OVPartition modules between its remaining PyTorch ops

The partitioner is torch.fx's CapabilityBasedPartitioner: it grows maximal groups of supported nodes
that can be fused without creating a cycle. A group needs two compute ops, or one op from
``HEAVY_OPS``, to be worth a call into OpenVINO; groups of views only are dropped.

If the converter rejects ops (it names them), or gives a multi-output op fewer outputs than a node
reads (support.py), that is remembered and the graph is partitioned again without them, so the
surrounding ops still reach OpenVINO. Any other failure of one partition makes
that partition run on ember's native backend, with the reason in the ``openvino`` log.
"""
from __future__ import annotations

import collections
import itertools
import operator
from dataclasses import dataclass, field

import sympy
import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.utils._sympy.functions import FloorDiv

from ember.backends.openvino import support
from ember.backends.openvino.convert import UnconvertibleOps, bake_constants, compile_partition
from ember.backends.openvino.options import OVOptions
from ember.backends.openvino.runtime import OVPartition
from ember.backends.openvino.shapes import spec_of, static_int
from ember.backends.openvino.threads import single_threaded_torch, user_controls_threads
from ember.diagnostics import logging as elog

MAX_ATTEMPTS = 4
PREFIX = "ov_partition_"
_graph_ids = itertools.count()
# What the last graphs became (``ember.backends.openvino.reports()``): plain dicts, newest last.
REPORTS: collections.deque = collections.deque(maxlen=256)


def log(text: str) -> None:
    elog.artifact("openvino", text)


def copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A structural copy (nodes and meta; attribute tensors shared), safe to partition in place."""
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    graph._codegen = gm.graph._codegen
    return fx.GraphModule(gm, graph, class_name=type(gm).__name__)


class NativePartition(torch.nn.Module):
    """A partition OpenVINO could not take, run by ember's native backend."""

    def __init__(self, fn, reason: str):
        super().__init__()
        self.fn, self.reason = fn, reason

    def forward(self, *args):
        return self.fn(*args)


def native(sub: fx.GraphModule):
    from ember.native import compile_aten_graph
    return compile_aten_graph(sub, [n.meta.get("val") for n in sub.graph.nodes if n.op == "placeholder"])


# sympy operations of size expressions -> the Python operators that compute them on ints
_SIZE_OPS = {sympy.Add: operator.add, sympy.Mul: operator.mul, FloorDiv: operator.floordiv}


def read_sizes_from_inputs(gm: fx.GraphModule) -> None:
    """Dynamic shapes: compute every size from the graph's inputs, each expression once.

    Size arithmetic runs in Python between partitions. A size read off an intermediate tensor
    (``sym_size(t, 1)`` = ``s0 + 1``) would wait for the partition computing ``t`` while feeding ops
    of that same partition, and the partitioner would have to cut the partition in two. So each size
    node becomes the same expression over sizes read off the inputs (``sym_size(x, 1) + 1``); when the
    expression has operations ``_SIZE_OPS`` does not know, the node stays as it is."""
    sources = _SizeSources(gm)
    for node in list(gm.graph.nodes):
        if not (support.is_size_arithmetic(node) and isinstance(node.meta["val"], torch.SymInt)):
            continue
        expr = node.meta["val"].node.expr
        if isinstance(sources.known.get(expr), fx.Node):
            computed = sources.known[expr]
        elif node.target is torch.ops.aten.sym_size.int and node.args[0].op == "placeholder":
            computed = None  # already read off an input
        else:
            computed = sources.compute(expr, before=node)
        if computed is None or computed is node:
            sources.known[expr] = node  # the first node of its expression: later ones reuse it
            continue
        node.replace_all_uses_with(computed)
        gm.graph.erase_node(node)
    if sources.emitted:
        gm.graph.eliminate_dead_code()  # partial computations of expressions that could not be finished


class _SizeSources:
    """Where each size expression is computed: a node earlier in the graph, or (placeholder, dim)."""

    def __init__(self, gm: fx.GraphModule):
        self.graph = gm.graph
        self.known: dict = {}
        self.emitted = False
        for node in gm.graph.nodes:
            val = node.meta.get("val") if node.op == "placeholder" else None
            if isinstance(val, torch.SymInt):
                self.known.setdefault(val.node.expr, node)
            elif isinstance(val, torch.Tensor):
                for d, size in enumerate(val.shape):
                    if isinstance(size, torch.SymInt):
                        self.known.setdefault(size.node.expr, (node, d))

    def compute(self, expr, before: fx.Node):
        """A node (or int) computing ``expr`` from the inputs, inserted before ``before``; or None."""
        if expr.is_number:
            return int(expr)
        found = self.known.get(expr)
        if isinstance(found, fx.Node):
            return found
        if isinstance(found, tuple):
            placeholder, dim = found
            return self._emit(torch.ops.aten.sym_size.int, found, placeholder.meta["val"].shape[dim], expr, before)
        op = _SIZE_OPS.get(type(expr))
        terms = [self.compute(a, before) for a in expr.args] if op is not None else [None]
        if any(t is None for t in terms):
            return None
        acc = terms[0]
        for k, term in enumerate(terms[1:], 2):
            value = op(_value(acc), _value(term))
            acc = self._emit(op, (acc, term), value, expr.func(*expr.args[:k]) if k < len(terms) else expr, before)
        return acc

    def _emit(self, target, args: tuple, value, expr, before: fx.Node) -> fx.Node:
        with self.graph.inserting_before(before):
            node = self.graph.call_function(target, args)
        node.meta["val"] = value
        self.known[expr] = node
        self.emitted = True
        return node


def _value(arg):
    return arg.meta["val"] if isinstance(arg, fx.Node) else arg


def propose(gm: fx.GraphModule, opts: OVOptions) -> tuple[list, dict]:
    rules = support.Support(opts)
    partitioner = CapabilityBasedPartitioner(
        gm, rules, allows_single_node_partition=False,
        non_compute_ops=sorted(support.NON_COMPUTE_OPS),
        allowed_single_node_partition_ops=sorted(support.HEAVY_OPS))
    return partitioner.propose_partitions(), rules.reasons


@dataclass
class Built:
    """The partitioned, compiled form of a graph."""
    module: fx.GraphModule           # takes the graph's inputs; calls OVPartition modules
    partitions: list = field(default_factory=list)  # one dict per OpenVINO partition
    native: list = field(default_factory=list)      # one dict per partition OpenVINO failed on
    torch_ops: int = 0               # compute ops left in PyTorch (views and getitems not counted)
    run: object = None               # the callable to use (module.forward, maybe thread-limited)
    threads_limited: bool = False    # PyTorch runs on one thread during calls (threads.py)

    def report(self, name: str, reasons: dict) -> dict:
        calls = [n for n in self.module.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
        return {"graph": name, "fully_converted": self.fully_converted,
                "dynamic_inputs": {n.name: spec_of(n.meta["val"]).text() for n in self.module.graph.nodes
                                   if n.op == "placeholder" and support.is_symbolic(n.meta.get("val"))},
                "partitions": [{k: v for k, v in p.items() if k != "signature"} for p in self.partitions],
                "native_partitions": list(self.native),
                "torch_ops": sorted({str(n.target) for n in calls if not support.is_size_arithmetic(n)}),
                "size_ops": sorted({str(n.target) for n in calls if support.is_size_arithmetic(n)}),
                "kept_in_pytorch": dict(reasons), "threads_limited": self.threads_limited}

    @property
    def fully_converted(self) -> bool:
        return len(self.partitions) == 1 and not self.native and self.torch_ops == 0

    def direct_form(self) -> tuple[list[int], list[int]] | None:
        """For a graph that is one OpenVINO call and nothing else: (the graph input position feeding
        each partition input, the partition output behind each graph output); else None."""
        if not self.fully_converted:
            return None
        nodes = list(self.module.graph.nodes)
        placeholders = {n: k for k, n in enumerate(n for n in nodes if n.op == "placeholder")}
        call = next(n for n in nodes if n.op == "call_module")
        if not all(a in placeholders for a in call.args):
            return None
        outputs = []
        for out in next(n for n in reversed(nodes) if n.op == "output").args[0]:
            if not (isinstance(out, fx.Node) and out.target is operator.getitem and out.args[0] is call):
                return None
            outputs.append(out.args[1])
        return [placeholders[a] for a in call.args], outputs


def _direct(runner, inputs: list[int], outputs: list[int]):
    """A graph that is one OpenVINO call: skip the FX wrapper (a few microseconds per call)."""
    def run(*args):
        outs = runner(*[args[i] for i in inputs])
        return tuple([outs[j] for j in outputs])
    return run


def _finish(module: fx.GraphModule, parts: tuple, opts: OVOptions, name: str, reasons: dict) -> Built:
    ov_parts, native_parts = parts
    built = Built(module, ov_parts, native_parts, _torch_op_count(module))
    built.run = module.forward
    form = built.direct_form()
    if form is not None:
        built.run = _direct(getattr(module, ov_parts[0]["name"].rsplit(".", 1)[1]).forward, *form)
    elif ov_parts and built.torch_ops and not user_controls_threads(opts):
        built.run = single_threaded_torch(module.forward)  # see threads.py
        built.threads_limited = True
    REPORTS.append(built.report(name, reasons))
    return built


def build(gm: fx.GraphModule, example_inputs: list, frozen: set[int], opts: OVOptions, name: str = "") -> Built:
    """The partitioned, compiled form of ``gm``, taking the same inputs.

    ``frozen``: placeholder positions whose current values (``example_inputs``) are baked into the
    OpenVINO models as constants; the caller guarantees they do not change (see backend.py)."""
    name = name or f"graph{next(_graph_ids)}"
    for attempt in range(MAX_ATTEMPTS):
        work = copy_graph_module(gm)
        read_sizes_from_inputs(work)
        partitions, reasons = propose(work, opts)
        if not partitions:
            log(f"{name}: nothing to run in OpenVINO; the graph runs in PyTorch"
                + _summary(reasons))
            return _finish(work, ([], []), opts, name, reasons)
        fuse_by_partitions(work, [p.nodes for p in partitions], prefix=PREFIX, always_return_tuple=True)
        try:
            parts = _compile_partitions(work, example_inputs, frozen, opts, name)
        except UnconvertibleOps as exc:
            support.reject(exc.names)
            support.limit_outputs(exc.short)
            log(f"{name}: {exc}; partitioning again without them")
            continue
        work.recompile()
        built = _finish(work, parts, opts, name, reasons)
        log(f"{name}: {len(built.partitions)} OpenVINO partition(s), {len(built.native)} on the native "
            f"backend, {built.torch_ops} compute op(s) left in PyTorch" + _summary(reasons))
        return built
    log(f"{name}: gave up converting after {MAX_ATTEMPTS} attempts; the graph runs in PyTorch")
    return _finish(copy_graph_module(gm), ([], []), opts, name, reasons)


def _compile_partitions(work: fx.GraphModule, example_inputs: list, frozen: set[int], opts: OVOptions,
                        name: str) -> tuple[list, list]:
    placeholders = {n: k for k, n in enumerate(n for n in work.graph.nodes if n.op == "placeholder")}
    report, failed = [], []
    for node in [n for n in work.graph.nodes if n.op == "call_module" and n.target.startswith(PREFIX)]:
        sub = getattr(work, node.target)
        constants, kept = {}, []
        for k, arg in enumerate(node.args):
            if arg.op == "get_attr":
                constants[k] = getattr(work, arg.target)   # a constant make_fx lifted out of the graph
            elif arg.op == "placeholder" and placeholders[arg] in frozen:
                constants[k] = example_inputs[placeholders[arg]]
            elif static_int(arg.meta.get("val")) is not None:
                constants[k] = static_int(arg.meta["val"])  # a size read with sym_size, found static
            else:
                kept.append(arg)
        sub = bake_constants(sub, constants)
        label = f"{name}.{node.target}"
        reason = None
        try:
            compiled, sig, key, hit = compile_partition(sub, opts, lambda msg: log(f"{label}: {msg}"))
            runner = OVPartition(label, compiled, sig, sub, native)
            report.append({"name": label, "ops": _targets(sub), "cache_key": key, "cache_hit": hit,
                           "signature": sig, "constants": len(constants),
                           "dynamic_inputs": sig.dynamic_inputs(), "symbol_ranges": sig.symbol_ranges()})
        except UnconvertibleOps as exc:
            if exc.names & set(_targets(sub)) or exc.short:
                raise  # ops of this graph: partition again without them (or their short outputs)
            reason = f"OpenVINO could not convert it: {exc}"
        except Exception as exc:  # noqa: BLE001 - conversion or compilation failed: run it natively
            reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        if reason is not None:
            log(f"{label}: OpenVINO failed ({reason}); this partition runs on ember's native backend")
            runner = NativePartition(native(sub), reason)
            failed.append({"name": label, "ops": _targets(sub), "reason": reason})
        setattr(work, node.target, runner)
        node.args = tuple(kept)
    work.graph.eliminate_dead_code()  # get_attr nodes now baked into partitions
    return report, failed


def _targets(gm: fx.GraphModule) -> list[str]:
    """The ops of a partition, by name (``aten.convolution.default``), each once."""
    return sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem})


def _torch_op_count(gm: fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
               and _qualified(n.target) not in support.NON_COMPUTE_OPS and not support.is_size_arithmetic(n))


def _qualified(target) -> str:
    return f"torch.ops.{target}" if isinstance(target, torch._ops.OpOverload) else str(target)


def _summary(reasons: dict) -> str:
    """Why ops stayed in PyTorch, grouped by reason (the first few node names of each)."""
    if not reasons:
        return ""
    by_reason: dict[str, list] = {}
    for node, why in reasons.items():
        by_reason.setdefault(why, []).append(node)
    lines = [f"\n  kept in PyTorch ({len(names)}): {why}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
             for why, names in by_reason.items()]
    return "".join(lines)
