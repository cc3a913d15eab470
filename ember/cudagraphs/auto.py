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
             and its pool (``pool_bytes``) <= ``pool_limit``
             and the graph can be captured (``analysis.skip_reason``: CUDA tensors only, static sizes,
             no host synchronization)

FLOPs are counted from the graph (``graph_flops``: torch's per-op FLOP formulas on the nodes' shapes);
bytes moved are the native report's (every buffer each kernel or extern call reads and writes). The
rates are deliberately low (a third of an H100's bf16 peak, two thirds of its copy bandwidth): an
overestimate of device time keeps a graph out, never forces one in. A graph of one launch gains
nothing from a replay.

That estimate is the fast path. An inference graph it rejects as device-bound (or as moving more than
MAX_BYTES) that can be captured and whose pool fits is *measured* (``measurable``, ``measure``): its
calls 2..4 are timed, host (``perf_counter``) against device (CUDA events), and it replays from then
on when host >= ``measured_host_fraction`` x device (``decide_measured``). The fixed host cost per
launch is far off for graphs of library calls: BERT-base inference on the H100 host was estimated at
~0.7 ms of host time for ~2.9 ms of device time, and measured at 3.98 ms against 1.72 ms.

Memory: what a replayed graph holds for good is its pool, its peak of live intermediates plus its
outputs (``pool_bytes``, read from the graph's shapes), not the bytes it moves (BERT moves far more
than it keeps alive at once); the bound is ``pool_limit`` (``Rule.max_pool_bytes``,
``Rule.max_pool_fraction`` of the device's memory).

Training graphs (forward and backward, ``training=True``) have their own rule (``decide_training``):
their device time is rarely below their host time, but a step whose host time is a large part of
its device time still waits on the host in places (ResNet-50's late layers: 7x7 activations, a
cuDNN call costing the host ~40 us for a few us of device work), and the backward cannot start
before the forward is issued. So a training graph replays when its host estimate, where an ATen call
counts ``host_us_per_extern`` (a cuDNN or cuBLAS call costs the host far more than a Triton launch),
is at least ``train_host_fraction`` of its device estimate (a convolution counts
``host_us_per_convolution``, its backward twice that). With the estimates ember logged on the H100
(host / device, forward and backward): ResNet-50 b64 0.53, 0.42 and a 1B Llama 0.37, 0.31 replay (Llama's step went from 22-28 ms to
19.6 ms, memory +3%); GPT-2 b8x512 0.20, 0.17 does not (replayed, it gained 1% and its peak memory
grew 24%). Distributed training is left alone. There is no byte limit: the saved
tensors a replayed forward keeps in its pool are what every step needs at its peak anyway.
The replay machinery is ``reduce-overhead``'s (``runner``): outputs a caller still
holds are never overwritten, inputs that move are copied, anything odd runs the compiled function.

Each decision is logged (``ember.cudagraphs`` logger) and kept in ``DECISIONS`` (name, replay?, why); a
measured graph's entry says "deciding by timing" until its measurement replaces it.
"""
from __future__ import annotations

import contextlib
import contextvars
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
    # a graph moving more than this is never replayed on the estimate alone: an inference graph is
    # measured instead (``measure``), a training graph's own rule has no such limit
    max_bytes: int = 64 << 20
    # what a replayed graph holds for good is its pool: its peak of live intermediates and its outputs
    # (``pool_bytes``). The caching allocator keeps that peak reserved after an eager call anyway; in a
    # graph's private pool only other work can no longer reuse it between calls. So the bound is the
    # smaller of a fixed 4 GiB and a tenth of the device's memory: at most a tenth of the device is
    # set apart (8 GB on an 80 GB H100; BERT-base's inference at b16x256 in bf16 keeps tens of MB alive
    # at once: a 16x256x3072 FFN activation is 25 MB)
    max_pool_bytes: int = 4 << 30
    max_pool_fraction: float = 0.1
    # measured decision (inference graphs the estimate rejects, ``measure``): calls timed after the
    # first (which may compile lazily), and how many later calls may pass before their events are read
    # with a synchronize (they are read with ``query()`` until then)
    measure_calls: int = 3            # 0: no measuring (the estimate alone decides)
    measure_wait_calls: int = 16
    # replay when measured host time >= this fraction of measured device time. A starved GPU runs a
    # call's kernels as the host issues them, so its events span the host's issue time plus the last
    # kernel: host / device sits just under 1, not above it; 0.8 leaves that tail and the timers' noise
    # room. Below 0.8 the host stays ahead of the device and a replay saves nothing the GPU waits for.
    measured_host_fraction: float = 0.8
    # training graphs (decide_training): an ATen call's host cost on the H100 host. ATen calls of a
    # ResNet-50 training step averaged 41 us each under cProfile (cuDNN convolutions; a convolution's
    # backward is two cuDNN calls); cuBLAS matmuls and attention cost ~10 us
    host_us_per_extern: float = 10.0
    host_us_per_convolution: float = 40.0
    train_host_fraction: float = 0.25


RULE = Rule()
DECISIONS: list = []  # (graph name, replayed?, reason) per decision of this process
_SHARED = contextvars.ContextVar("ember_cudagraphs_shared", default=None)


@contextlib.contextmanager
def shared_by_call_sites():
    """Graphs compiled inside run for several call sites with other tensors each (regional
    compilation's shared parts: every layer's own weights). A replay would copy each call's inputs
    into the recorded addresses (a 1B Llama layer's 50M weights, every call: its training step went
    from 19.5 ms to 34 ms on the H100), so such graphs never replay automatically.

    Yields a list: each inference graph compiled inside appends what capturing it would face
    (``part_facts``), so that the split graph calling the parts can be replayed whole
    (``split_replay``), with every layer's weights read where they lie."""
    facts: list = []
    token = _SHARED.set(facts)
    try:
        yield facts
    finally:
        _SHARED.reset(token)


def part_facts(gm: fx.GraphModule, example_inputs, api, pending=None, training: bool = False) -> dict:
    """What ``split_replay`` needs of one shared part, read before its compiler rewrites ``gm``:
    why it cannot be captured (or None), whether it writes an input, and its pool's size (0 when it
    cannot be captured). A cached graph's stored facts are read instead of its nodes."""
    from ember.cudagraphs import analysis
    if training:
        return dict(problem="a training graph (forward and backward)", mutates=True, pool=0)
    stored = (pending[0].get("auto") if pending is not None else None)
    if pending is not None and stored is None:
        return dict(problem="a cached graph without its capture facts", mutates=True, pool=0)
    if stored is not None:
        problem = analysis.skip_reason(None, list(example_inputs), api, facts=stored["capture"])
        mutated, pool = stored["mutated"], stored.get("pool")
    else:
        problem = analysis.skip_reason(gm, list(example_inputs), api)
        mutated = analysis.mutated_inputs(gm) if problem is None else ()
        pool = pool_bytes(gm) if problem is None else 0
    if pool is None:
        problem = problem or "its pool size is not known"
    return dict(problem=problem, mutates=bool(mutated), pool=pool or 0)


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


# ATen calls costing the host a cuDNN convolution each (the backward: data and weight gradients)
_CONVOLUTION_CALLS = {"convolution": 1, "convolution_backward": 2}


def _convolutions(gm: fx.GraphModule) -> tuple[int, int]:
    """(convolution nodes, the cuDNN calls they make) of ``gm``."""
    nodes = calls = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            c = _CONVOLUTION_CALLS.get(n.target.overloadpacket.__name__, 0)
            nodes, calls = nodes + bool(c), calls + c
    return nodes, calls


def _nbytes(v) -> int:
    if isinstance(v, (list, tuple)):
        return sum(_nbytes(x) for x in v)
    if not isinstance(v, torch.Tensor):
        return 0
    n = v.numel()
    return n * v.element_size() if isinstance(n, int) else 0  # (a symbolic size: never captured anyway)


def _aliases_input(n: fx.Node) -> bool:
    """Does ``n``'s value live in its first argument's memory (a view, an in-place op, a getitem)?"""
    if "getitem" in getattr(n.target, "__name__", ""):
        return True
    if isinstance(n.target, torch._ops.OpOverload):
        rets = n.target._schema.returns
        return bool(rets) and rets[0].alias_info is not None
    return False


def pool_bytes(gm: fx.GraphModule) -> int:
    """Peak bytes the graph allocates and holds at once, in node order (each value freed after its
    last use, views and in-place results counted in their base, outputs kept to the end): what a replay
    keeps in its pool. Inputs and constants are the caller's, not counted. The native code generator
    fuses most intermediates away, so this bounds its buffers from above."""
    nodes = list(gm.graph.nodes)
    root, last = {}, {}
    for i, n in enumerate(nodes):
        if n.op == "call_function" and _aliases_input(n) and n.args and isinstance(n.args[0], fx.Node):
            root[n] = root.get(n.args[0], n.args[0])
        for a in n.all_input_nodes:
            r = root.get(a, a)
            last[r] = len(nodes) if n.op == "output" else max(last.get(r, -1), i)
    live = peak = 0
    frees: dict = {}
    for i, n in enumerate(nodes):
        if n.op == "call_function" and n not in root:
            size = _nbytes(n.meta.get("val"))
            live += size
            peak = max(peak, live)
            frees.setdefault(last.get(n, i), []).append(size)
        live -= sum(frees.pop(i, ()))
    return peak


def graph_facts(gm: fx.GraphModule) -> dict:
    """Everything the decision and the replay read of a graph's nodes (their ops and ``val`` shapes),
    as plain data: FLOPs, convolutions, the ATen estimate, ``analysis.capture_facts``, the inputs it
    writes and its pool's size (``pool_bytes``). Stored with a cached graph (``ember.aot.deferred.summary_of``: the graph as traced, before
    any compiler rewrites it), so a warm start decides without building the graph's nodes (GPT-2
    training on the H100: building them for the decision was 0.57 s of a 1.17 s warm first call). A
    decision depends on nothing else of the graph; the compiled report, the example inputs, the graph
    API (which device) and ``RULE`` are read at each decision, so the stored facts hold whatever
    device or configuration the entry is loaded under."""
    from ember.cudagraphs import analysis
    return dict(flops=graph_flops(gm), convolutions=_convolutions(gm), aten=_aten_estimate(gm),
                capture=analysis.capture_facts(gm), mutated=analysis.mutated_inputs(gm), pool=pool_bytes(gm))


def estimate(gm: fx.GraphModule | None, compiled, flops: int, convolutions: tuple | None = None,
             aten: tuple | None = None, pool: int | None = None, pool_limit: int | None = None) -> dict:
    """launches, bytes, flops, host_us, device_us, pool_bytes of one call of ``compiled`` (compiled
    from ``gm``). ``convolutions``: (nodes, cuDNN calls), ``aten``: ``_aten_estimate`` (launches,
    bytes), ``pool``: ``pool_bytes``, when known without reading ``gm`` (see _decide_deferred); a pool
    not known is bounded by the bytes moved (every buffer the graph allocates is written at least
    once). ``pool_limit``: what the device allows a pool (``pool_limit``)."""
    report = (getattr(compiled, "ember_native", None) or {}).get("report")
    if report:
        launches, nbytes = int(report["kernels"]) + int(report["externs"]), int(report["bytes"])
    else:
        launches, nbytes = aten if aten is not None else _aten_estimate(gm)
    externs = int(report["externs"]) if report else launches
    conv_nodes, conv_calls = convolutions if convolutions is not None else _convolutions(gm)
    if conv_nodes > externs:  # (a convolution the code generator lowered itself)
        conv_nodes = conv_calls = 0
    extern_us = RULE.host_us_per_convolution * conv_calls + RULE.host_us_per_extern * (externs - conv_nodes)
    if pool is None:
        pool = pool_bytes(gm) if gm is not None else nbytes
    return dict(launches=launches, externs=externs, bytes=nbytes, flops=flops, pool_bytes=pool,
                pool_limit=pool_limit if pool_limit is not None else RULE.max_pool_bytes,
                host_us=RULE.host_us_per_launch * launches,
                train_host_us=RULE.host_us_per_launch * (launches - externs) + extern_us,
                device_us=nbytes / RULE.bytes_per_us + flops / RULE.flops_per_us)


def decide(est: dict | None, capture_problem: str | None, rule: Rule = RULE) -> tuple[bool, str]:
    """(replay?, why) for a graph with estimate ``est``; ``capture_problem``: why it cannot be captured
    (then ``est`` may be None). A "no" for a graph that ``measurable`` accepts is not final for an
    inference graph: it is measured (``measure``)."""
    return _verdict(est, capture_problem, rule)[:2]


def measurable(est: dict | None, capture_problem: str | None, rule: Rule = RULE) -> bool:
    """Would timing the graph's first calls decide it (``decide_measured``)? Yes for a graph that can
    be captured, has launches to save and a pool the device allows, and that the estimate rejects as
    device-bound (or moving more than ``max_bytes``): the estimate's host time is a fixed cost per
    launch, while a cuBLAS, cuDNN or attention call costs the host 10-40 us and hosts differ by 1.5x
    (BERT-base inference on the H100 host: ~0.7 ms of host time estimated, 3.98 ms measured, for 1.72 ms
    on the device)."""
    return rule.measure_calls > 0 and _verdict(est, capture_problem, rule)[2]


def _verdict(est, capture_problem, rule) -> tuple[bool, str, bool]:
    """(replay?, why, measurable?)"""
    if capture_problem is not None:
        return False, f"cannot be captured: {capture_problem}", False
    if est["launches"] < rule.min_launches:
        return False, f"{est['launches']} launch(es): nothing to save", False
    over = _pool_over(est)
    if over:
        return False, over, False
    if est["bytes"] > rule.max_bytes:
        return False, f"moves {est['bytes']} bytes > {rule.max_bytes}: device-bound by the estimate", True
    if est["device_us"] > est["host_us"]:
        return False, (f"device-bound: ~{est['device_us']:.0f} us of device work > ~{est['host_us']:.0f} us to "
                       f"launch {est['launches']} kernels"), True
    return True, (f"host-bound: {est['launches']} launches (~{est['host_us']:.0f} us of host time) for "
                  f"~{est['device_us']:.1f} us of device work"), False


def _pool_over(est) -> str | None:
    pool = est.get("pool_bytes", est["bytes"])
    limit = est.get("pool_limit", RULE.max_pool_bytes)
    if pool > limit:
        return f"its pool would hold {pool / 2**20:.0f} MiB for good > {limit / 2**20:.0f} MiB allowed"
    return None


def pool_limit(api, device, rule: Rule = RULE) -> int:
    """The largest pool a replayed graph of ``device`` may hold (``Rule.max_pool_bytes``,
    ``Rule.max_pool_fraction`` of the device's memory where the graph API tells it)."""
    total = None
    try:
        total = api.total_memory(device) if hasattr(api, "total_memory") and device is not None else None
    except Exception:  # noqa: BLE001 - a device that does not tell: the fixed bound
        total = None
    return min(rule.max_pool_bytes, int(rule.max_pool_fraction * total)) if total else rule.max_pool_bytes


def decide_measured(est: dict | None, capture_problem: str | None, samples: list,
                    rule: Rule = RULE) -> tuple[bool, str]:
    """(replay?, why) for an inference graph from ``samples``: (host us, device us) of each timed call
    (``measure.Measured``: host time is the Python call, device time a pair of CUDA events around it).
    The smallest of each is taken: a timer only adds time (a preemption, a full launch queue). Replays
    when the host's share reaches ``measured_host_fraction`` of the device's: the GPU waits for it."""
    if capture_problem is not None:
        return False, f"cannot be captured: {capture_problem}"
    over = _pool_over(est)
    if over:
        return False, over
    host, device = min(h for h, _ in samples), min(d for _, d in samples)
    frac = rule.measured_host_fraction
    shown = f"host {host:.0f} us, device {device:.0f} us per call (least of {len(samples)} timed calls)"
    if host >= frac * device:
        return True, f"measured host-bound: {shown}; host >= {frac:g} x device"
    return False, f"measured device-bound: {shown}; host < {frac:g} x device"


def _distributed() -> bool:
    """A process group is up (DDP's and FSDP's hooks, FSDP's resharded parameters: left alone)."""
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def decide_training(est: dict | None, capture_problem: str | None, rule: Rule = RULE) -> tuple[bool, str]:
    """(replay?, why) for a training forward or backward graph (see the module docstring)."""
    if capture_problem is not None:
        return False, f"cannot be captured: {capture_problem}"
    if _distributed():
        return False, "distributed training: parameters may be resharded or re-allocated between steps"
    if est["launches"] < rule.min_launches:
        return False, f"{est['launches']} launch(es): nothing to save"
    host, device = est["train_host_us"], est["device_us"]
    if host < rule.train_host_fraction * device:
        return False, (f"device-bound: ~{host:.0f} us to launch {est['launches']} kernels ({est['externs']} ATen calls) "
                       f"< {rule.train_host_fraction:g} x ~{device:.0f} us of device work")
    return True, (f"host time near device time: ~{host:.0f} us to launch {est['launches']} kernels "
                  f"({est['externs']} ATen calls) for ~{device:.0f} us of device work")


def wrap_auto(compiler, *, api=None, training: bool = False, finish=None):
    """A graph compiler (for ``aot_autograd``'s inference graphs; with ``training``, its forward or
    backward graphs) whose result replays as a CUDA graph when ``decide`` (``decide_training``) says
    so; an inference graph that ``measurable`` accepts is run as compiled while its first calls are
    timed, and replays from then on if ``decide_measured`` says so (``measure.Measured``).
    ``ember.config.auto_cudagraphs`` is read at each compile. ``finish(fn)``: what a graph that does
    not replay returns instead of ``fn`` (the backward's boxed form)."""
    finish = finish or (lambda fn: fn)
    def compile_auto(gm, example_inputs):
        from ember.config import config
        if not config.auto_cudagraphs:
            return finish(compiler(gm, example_inputs))
        from ember.cudagraphs import analysis, cudagraphify
        from ember.cudagraphs.pool import TorchCuda
        cuda = api or TorchCuda()
        from ember.aot import deferred
        pending = deferred.pending(gm)
        facts = None  # (what a cached graph stored of its nodes: the replay reads them, not gm's nodes)
        # (a graph API's device only: asking a CPU graph's device for its memory could start CUDA)
        device = next((x.device for x in example_inputs if isinstance(x, torch.Tensor) and cuda.is_graph_tensor(x)), None)
        limit = pool_limit(cuda, device)
        sink = _SHARED.get()
        if sink is not None:  # (no estimate needed: the graph is never replayed on its own)
            sink.append(part_facts(gm, example_inputs, cuda, pending, training))
            fn = compiler(gm, example_inputs)
            if fn is None:
                fn = gm.forward
            problem, est = "shared by several call sites (regional compilation): its inputs move at every call", None
        elif pending is not None:  # a graph from the aot cache, its nodes not built
            fn, problem, est, facts = _decide_deferred(compiler, gm, example_inputs, cuda, pending, training, limit)
        else:
            # read before the compiler rewrites gm; sizes are read only of a graph that can be captured
            # (static sizes: a symbolic size read here would add a guard to the frontend's shape env)
            problem = analysis.skip_reason(gm, list(example_inputs), cuda)
            flops = graph_flops(gm) if problem is None else 0
            pool = pool_bytes(gm) if problem is None and not training else 0  # (training: no pool limit)
            fn = compiler(gm, example_inputs)
            if fn is None:
                fn = gm.forward
            est = estimate(gm, fn, flops, pool=pool, pool_limit=limit) if problem is None else None
        replay, why = (decide_training if training else decide)(est, problem)
        measuring = not training and not replay and measurable(est, problem)
        if measuring:
            why += f"; deciding by timing calls 2-{1 + RULE.measure_calls}"
        name = f"{type(gm).__name__}#auto{len(DECISIONS)}"
        DECISIONS.append((name, replay, why))
        info = getattr(fn, "ember_native", None)
        if isinstance(info, dict) and est is not None:
            info["auto_cudagraphs"] = dict(est, replay=replay, reason=why)
        log.info("ember auto cudagraphs: %s %s: %s", name, "replays as a CUDA graph" if replay else "runs as compiled", why)
        if measuring:
            from ember.cudagraphs import stored
            from ember.cudagraphs.measure import Measured
            from ember.cudagraphs.runner import Runner
            runner = cudagraphify(fn, gm, example_inputs, name=name, api=cuda, facts=facts)
            if not isinstance(runner, Runner):  # (it could not be captured after all: logged)
                return fn
            rec = stored.load(fn, cuda, device, RULE)
            if rec is not None:  # measured by an earlier process on this kind of device and host
                return _reuse(name, rec, fn, runner, finish)
            return Measured(fn, runner, name=name, api=cuda, device=device, est=est)
        return cudagraphify(fn, gm, example_inputs, name=name, api=cuda, facts=facts) if replay else finish(fn)

    compile_auto.__name__ = f"auto_cudagraphs({getattr(compiler, '__name__', 'compiler')})"
    return compile_auto


def _reuse(name: str, rec: dict, fn, runner, finish):
    """The measured decision ``rec`` an earlier process stored for this graph (``stored``), taken as
    it was: the runner (replay) or the compiled function, as the measuring process ended up calling."""
    from ember.cudagraphs.measure import record
    replay, why = rec["replay"], f"reused measured decision: {rec['why']}"
    record(name, replay, why, rec.get("samples") or [], getattr(fn, "ember_native", None))
    log.info("ember auto cudagraphs: %s %s: %s", name, "replays as a CUDA graph" if replay else "runs as compiled", why)
    return runner if replay else finish(fn)


def _decide_deferred(compiler, gm, example_inputs, cuda, pending, training: bool = False, limit: int | None = None):
    """(compiled, capture problem, estimate, graph facts) for a graph whose nodes are not built
    (``ember.aot.deferred``): compiled first, and decided from the compiled report and the facts stored
    with the graph (``graph_facts``), so a warm start builds none of its nodes. An entry without them
    (they could not be taken when it was stored) has its graph read as loaded: ``gm`` if the compiler
    left it unbuilt, else a copy from the summary (the compiler may have rewritten ``gm``)."""
    from ember.aot import deferred
    from ember.cudagraphs import analysis
    fn = compiler(gm, example_inputs)
    if fn is None:
        fn = gm.forward
    facts = pending[0].get("auto")
    if facts is not None:
        problem = analysis.skip_reason(None, list(example_inputs), cuda, facts=facts["capture"])
        est = None
        if problem is None:
            est = estimate(None, fn, facts["flops"], convolutions=facts["convolutions"], aten=facts["aten"],
                           pool=facts.get("pool"), pool_limit=limit)
        return fn, problem, est, facts
    report = (getattr(fn, "ember_native", None) or {}).get("report")
    if report and training:
        # (a training graph's ATen calls counted as convolutions' backward: the most host time they
        # could cost, so a "no" here is a "no" with the graph read too. Not for an inference graph: its
        # "no" may be measured, which needs the graph's capture check)
        externs = int(report["externs"])
        est = estimate(gm, fn, 0, convolutions=(externs, 2 * externs), pool=0)
        if not decide_training(est, None)[0]:
            return fn, None, est, None
    pristine = gm if deferred.is_deferred(gm) else deferred.load(*pending)
    problem = analysis.skip_reason(pristine, list(example_inputs), cuda)
    est = None
    if problem is None:
        est = estimate(pristine, fn, graph_flops(pristine), pool=pool_bytes(pristine), pool_limit=limit)
    return fn, problem, est, None
