"""Default mode: a small inference graph replays as a CUDA graph when launching it costs more host
time than the device needs to run it (``ember.config.auto_cudagraphs``; off: never in default mode).

Why: a small model's step is bound by host time. Each launch costs the host microseconds (a Triton
launch through ember's fast path ~3-5 us, an ATen call 5-20 us on the H100 host), while its kernel
may run in one or two; a 2-layer BERT of hidden size 64 is ~30 launches of almost no device work,
and was slower compiled than eager (issue 28). One graph replay is one launch for all of them.

The rule, per compiled inference graph, at compile time (``decide``; numbers in ``RULE``):

    launches  = Triton kernels + extern (ATen) calls of the compiled graph   (its ATen ops, run as is)
    host_us   = HOST_US_PER_LAUNCH * launches
    device_us = bytes moved / BYTES_PER_US + FLOPs / FLOPS_PER_US           (a lower bound: peak rates)
    replay   if launches >= MIN_LAUNCHES and device_us <= host_us and bytes moved <= MAX_BYTES
             and the graph can be captured (``analysis.skip_reason``: CUDA tensors only, static sizes,
             no host synchronization)

FLOPs are counted from the graph (``graph_flops``: torch's per-op FLOP formulas on the nodes' shapes);
bytes moved are the native report's (every buffer each kernel or extern call reads and writes). The
rates are deliberately low (a third of an H100's bf16 peak, two thirds of its copy bandwidth): an
overestimate of device time keeps a graph out, never forces one in. ``MAX_BYTES`` bounds what the
graph's pool holds for good. A graph of one launch gains nothing from a replay. Training graphs
(forward and backward) are left alone: they are rarely this small, and their saved tensors would
live in the pool. The replay machinery is ``reduce-overhead``'s (``runner``): outputs a caller still
holds are never overwritten, inputs that move are copied, anything odd runs the compiled function.

Each decision is logged (``ember.cudagraphs`` logger) and kept in ``DECISIONS`` (name, replay?, why).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.fx as fx

log = logging.getLogger("ember.cudagraphs")


@dataclass(frozen=True)
class Rule:
    host_us_per_launch: float = 5.0   # CPU time to issue one launch (Triton fast path ~3-5 us, ATen 5-20)
    bytes_per_us: float = 2.0e6       # 2 TB/s: two thirds of an H100's copy bandwidth
    flops_per_us: float = 2.5e8       # 250 TFLOP/s: a third of an H100's dense bf16 peak
    min_launches: int = 2             # one launch replayed is still one launch
    max_bytes: int = 64 << 20         # memory a replayed graph may move (its pool keeps buffers for good)


RULE = Rule()
DECISIONS: list = []  # (graph name, replayed?, reason) per decision of this process


def graph_flops(gm: fx.GraphModule) -> int:
    """FLOPs of one call of ``gm``, from torch's FLOP formulas (``torch.utils.flop_counter``: matmuls,
    convolutions, attention, forward and backward) applied to each node's ``val`` shapes; ops without
    a formula (pointwise, reductions) count 0: their cost is in the bytes they move."""
    from torch.utils.flop_counter import flop_registry
    total = 0
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        fn = flop_registry.get(getattr(n.target, "overloadpacket", n.target))
        if fn is None:
            continue
        args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta.get("val"))
        try:
            total += int(fn(*args, **kwargs, out_val=n.meta.get("val")))
        except Exception:  # noqa: BLE001 - a formula that does not fit these arguments: not counted
            continue
    return total


def _aten_estimate(gm: fx.GraphModule) -> tuple[int, int]:
    """(launches, bytes) of a graph run as is: one launch per op that computes (views are free), each
    reading its tensor arguments and writing its results."""
    launches, nbytes = 0, 0

    def size(v):
        return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is getattr or "getitem" in getattr(n.target, "__name__", ""):
            continue
        if isinstance(n.target, torch._ops.OpOverload) and n.target.is_view:
            continue
        launches += 1
        out = n.meta.get("val")
        nbytes += sum(size(v) for v in (out if isinstance(out, (list, tuple)) else [out]))
        nbytes += sum(size(a.meta.get("val")) for a in n.all_input_nodes)
    return launches, nbytes


def estimate(gm: fx.GraphModule, compiled, flops: int) -> dict:
    """launches, bytes, flops, host_us, device_us of one call of ``compiled`` (compiled from ``gm``)."""
    report = (getattr(compiled, "ember_native", None) or {}).get("report")
    if report:
        launches, nbytes = int(report["kernels"]) + int(report["externs"]), int(report["bytes"])
    else:
        launches, nbytes = _aten_estimate(gm)
    return dict(launches=launches, bytes=nbytes, flops=flops, host_us=RULE.host_us_per_launch * launches,
                device_us=nbytes / RULE.bytes_per_us + flops / RULE.flops_per_us)


def decide(est: dict | None, capture_problem: str | None, rule: Rule = RULE) -> tuple[bool, str]:
    """(replay?, why) for a graph with estimate ``est``; ``capture_problem``: why it cannot be captured
    (then ``est`` may be None)."""
    if capture_problem is not None:
        return False, f"cannot be captured: {capture_problem}"
    if est["launches"] < rule.min_launches:
        return False, f"{est['launches']} launch(es): nothing to save"
    if est["bytes"] > rule.max_bytes:
        return False, f"moves {est['bytes']} bytes > {rule.max_bytes}: device-bound, and its pool would be large"
    if est["device_us"] > est["host_us"]:
        return False, (f"device-bound: ~{est['device_us']:.0f} us of device work > ~{est['host_us']:.0f} us to "
                       f"launch {est['launches']} kernels")
    return True, (f"host-bound: {est['launches']} launches (~{est['host_us']:.0f} us of host time) for "
                  f"~{est['device_us']:.1f} us of device work")


def wrap_auto(compiler, *, api=None):
    """A graph compiler (for ``aot_autograd``'s inference graphs) whose result replays as a CUDA
    graph when ``decide`` says so; ``ember.config.auto_cudagraphs`` is read at each compile."""
    def compile_auto(gm, example_inputs):
        from ember.config import config
        if not config.auto_cudagraphs:
            return compiler(gm, example_inputs)
        from ember.cudagraphs import analysis, cudagraphify
        from ember.cudagraphs.pool import TorchCuda
        cuda = api or TorchCuda()
        from ember.aot import deferred
        pending = deferred.pending(gm)
        if pending is not None:  # a graph from the aot cache, its nodes not built
            fn, problem, est = _decide_deferred(compiler, gm, example_inputs, cuda, pending)
        else:
            # read before the compiler rewrites gm; sizes are read only of a graph that can be captured
            # (static sizes: a symbolic size read here would add a guard to the frontend's shape env)
            problem = analysis.skip_reason(gm, list(example_inputs), cuda)
            flops = graph_flops(gm) if problem is None else 0
            fn = compiler(gm, example_inputs)
            if fn is None:
                fn = gm.forward
            est = estimate(gm, fn, flops) if problem is None else None
        replay, why = decide(est, problem)
        name = f"{type(gm).__name__}#auto{len(DECISIONS)}"
        DECISIONS.append((name, replay, why))
        info = getattr(fn, "ember_native", None)
        if isinstance(info, dict) and est is not None:
            info["auto_cudagraphs"] = dict(est, replay=replay, reason=why)
        log.info("ember auto cudagraphs: %s %s: %s", name, "replays as a CUDA graph" if replay else "runs as compiled", why)
        return cudagraphify(fn, gm, example_inputs, name=name, api=cuda) if replay else fn

    compile_auto.__name__ = f"auto_cudagraphs({getattr(compiler, '__name__', 'compiler')})"
    return compile_auto


def _decide_deferred(compiler, gm, example_inputs, cuda, pending):
    """(compiled, capture problem, estimate) for a graph whose nodes are not built (``ember.aot.deferred``):
    compiled first, and when its report alone already rules a replay out (the FLOPs a graph adds only
    add device time, a capture problem only forbids), the graph is never read: a warm start of a large
    model builds none of its nodes. Otherwise the graph as loaded is read: ``gm`` if the compiler left
    it unbuilt, else a copy from the summary (the compiler may have rewritten ``gm``)."""
    from ember.aot import deferred
    from ember.cudagraphs import analysis
    fn = compiler(gm, example_inputs)
    if fn is None:
        fn = gm.forward
    report = (getattr(fn, "ember_native", None) or {}).get("report")
    if report:
        est = estimate(gm, fn, 0)
        if not decide(est, None)[0]:
            return fn, None, est
    pristine = gm if deferred.is_deferred(gm) else deferred.load(*pending)
    problem = analysis.skip_reason(pristine, list(example_inputs), cuda)
    est = estimate(pristine, fn, graph_flops(pristine)) if problem is None else None
    return fn, problem, est

