"""``compile_aten_graph``: the entry point of the native backend.

Pipeline (each step a module): lower (``lowering``) -> split long reductions (``split_reduction``) ->
verify (``ir``, optional) -> schedule and fuse (``scheduler``) -> Triton source per kernel
(``triton_emit``) -> wrapper source (``wrapper``) -> write to and import from the cache (``cache``).

Graphs traced with dynamic shapes (placeholders whose FakeTensors have SymInt sizes) compile once,
for every size: sizes are expressions over size symbols (``symbolic.py``) that the kernels take as
arguments and the wrapper reads from the inputs. A graph holding something that cannot be symbolic
(a size-dependent Python decision in a lowering, a size that is no input's size...) falls back, for
that graph only, to a static compile per input-size set (``specialize.PerShapeGraph``), the reason
in ``ember_native["reason"]``.

CPU tensors render the same scheduled kernels as C++ (``cpp_emit``, built in the background and
loaded by ``cpp_build``, run by ``cpp_graph``; the default, option ``cpu_codegen="cpp"``), unless
``cpu_codegen="aten"`` (``ember.config.native_cpu``, ``EMBER_NATIVE_CPU=aten``) or no working C++
compiler is found (a warning, once): then they run the ATen graph as it is (``gm.forward``); or
Triton is forced, by the argument
``force_triton=True``, by ``ember.config.config.native_force_triton`` if that field exists, or by the
environment variable ``EMBER_NATIVE_FORCE_TRITON=1``; then the kernels run in the Triton interpreter
(``TRITON_INTERPRET=1`` is set if it is not set yet). Graphs the backend cannot handle run as they are
too, with the reason logged; ops without a lowering become extern ATen calls, never silently wrong code.
"""
from __future__ import annotations

import sys
import time

import torch

from ember.config import environment
from ember.diagnostics import counters
from ember.native import cache, ir, runtime, triton_cache
from ember.native.lowering import Unsupported
from ember.native.specialize import PerShapeGraph
from ember.native.options import DEFAULT_OPTIONS, NativeOptions, resolve as resolve_options  # noqa: F401
from ember.native.symbolic import SymbolicUnsupported, has_symbolic_inputs

# NativeOptions (options.py) holds every setting and its one default; DEFAULT_OPTIONS is the same
# defaults as a dict, kept for callers of plan() that spell options as dicts

# graphs and kernels generated in this process (cache hits excluded), and static copies compiled by
# the per-size fallback: tests check that a symbolic graph generates its kernels once
COUNTERS = {"graphs": 0, "kernels": 0, "per_shape": 0, "layout_fallbacks": 0}


def _force_triton() -> bool:
    """``ember.config.native_force_triton`` (from EMBER_NATIVE_FORCE_TRITON when ember was imported)."""
    from ember.config import config

    return bool(config.native_force_triton)


def _uses_cuda(gm, example_inputs) -> bool:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            return True
    from ember.aot.deferred import value_device_types  # (a graph from the aot cache answers without its nodes)
    return "cuda" in value_device_types(gm)


def _log(msg):
    try:
        from ember.diagnostics import logging as elog
        elog.get_logger("graph_breaks").info(msg)
    except Exception:  # diagnostics are optional for the backend
        pass


def compile_aten_graph(gm: torch.fx.GraphModule, example_inputs, *, force_triton: bool | None = None,
                       options: dict | NativeOptions | None = None):
    """Compile an ATen-level, functionalized FX graph; returns ``fn(*args) -> outputs``.

    The returned function has an ``ember_native`` dict: ``report`` (kernels, externs, bytes moved),
    ``cache_hit``, ``compile_s``, ``wrapper`` (source path) and ``reason`` when the graph runs as is.
    """
    example_inputs = list(example_inputs)
    opts = resolve_options(options)  # first: a bad option is an error on every device
    force = force_triton if force_triton is not None else _force_triton()
    if not _uses_cuda(gm, example_inputs) and not force:
        if opts.cpu_codegen != "cpp":
            return _as_is(gm, "CPU tensors run the ATen graph (native_cpu='aten')")
        return _compile_cpp(gm, example_inputs, opts)
    on_cpu = not _uses_cuda(gm, example_inputs)
    if on_cpu and "triton" not in sys.modules:
        environment.request_triton_interpreter()
    try:
        import triton.language as tl
    except ImportError:
        return _as_is(gm, "triton is not installed", fallback=True)
    if on_cpu and type(tl.sum).__name__ != "InterpretedFunction":
        # the interpreter is chosen when triton is imported (make_fx in fake mode imports it)
        return _as_is(gm, "Triton on CPU tensors needs TRITON_INTERPRET=1 before triton is imported", fallback=True)
    triton_cache.ensure_safe(opts.cache_dir)  # before Triton builds or loads anything from its disk cache
    if has_symbolic_inputs(gm):
        try:
            return _compile(gm, example_inputs, opts)
        except (Unsupported, SymbolicUnsupported) as e:
            reason = str(e)
        except Exception as e:  # noqa: BLE001 - a gap of the symbolic path: per-size kernels are still right
            reason = f"{type(e).__name__}: {e}"
        _log(f"ember.native: symbolic sizes, compiling per input sizes: {reason}")
        return PerShapeGraph(gm, lambda g, args: compile_aten_graph(g, args, force_triton=force, options=opts),
                             reason)
    try:
        return _compile(gm, example_inputs, opts)
    except (Unsupported, SymbolicUnsupported) as e:  # the latter: a data-dependent size inside the graph
        _log(f"ember.native: running the graph as is: {e}")
        return _as_is(gm, str(e), fallback=True)


def _keep_freed_memory():
    """glibc malloc keeps what a call frees for the next one (ember/native/cpu_heap.py), once per process."""
    from ember.config import config
    from ember.native import cpu_heap
    if not cpu_heap._DONE:
        _log(f"ember.native: glibc malloc for CPU graphs: {cpu_heap.keep_freed_memory(bool(config.native_cpu_malloc))}")


def _compile_cpp(gm, example_inputs, opts):
    """CPU tensors through the C++ renderer (``cpp_emit``, ``cpp_build``). Whatever it cannot handle
    (no compiler, a dtype or index it cannot spell, a failed build) runs this graph's ATen code, the
    reason logged: never a wrong result."""
    from ember.native import cpp_build
    from ember.native.cpp_emit import CppUnsupported
    # (checked once per process, a warning says it once; a check still running is waited for at
    # the graph's first call, cpp_graph._bind, so that it overlaps this graph's code generation)
    why = cpp_build.problem(opts.cache_dir, wait=False)
    if why is not None:
        return _as_is(gm, f"no working C++ compiler, the ATen graph runs: {why}")
    _keep_freed_memory()

    def compile_one(g, args):
        try:
            return _compile(g, args, opts, "cpp")
        except (Unsupported, SymbolicUnsupported, CppUnsupported) as e:
            reason = f"C++ renderer: {e}"
        except (RuntimeError, OSError) as e:  # a build the compiler refused: a gap of the renderer
            reason = f"C++ build failed: {type(e).__name__}: {str(e)[:2000]}"
        _log(f"ember.native: running the graph as is: {reason}")
        return _as_is(g, reason, fallback=True)

    if has_symbolic_inputs(gm):
        try:
            return _compile(gm, example_inputs, opts, "cpp")
        except (Unsupported, SymbolicUnsupported, CppUnsupported) as e:
            reason = str(e)
        except Exception as e:  # noqa: BLE001 - a gap of the symbolic path: per-size kernels are still right
            reason = f"{type(e).__name__}: {e}"
        _log(f"ember.native: symbolic sizes, compiling per input sizes: {reason}")
        return PerShapeGraph(gm, compile_one, reason)
    return compile_one(gm, example_inputs)


def _layout_fallback(run, key):
    """What a wrapper calls when its inputs' sizes or strides are not the ones it was compiled for: the
    ATen graph as is (right, but eager-speed at every such call), counted and logged once."""
    seen = []

    def fallback(*args):
        if not seen:
            seen.append(True)
            COUNTERS["layout_fallbacks"] += 1
            counters.eager_fallback("native_layout", f"graph {key[:16]}: input sizes or strides it was not compiled for")
            _log(f"ember.native: graph {key[:16]} called with input sizes or strides it was not compiled for "
                 "(its wrapper's first lines list them: EMBER_LOGS=output_code); running its ATen graph as is")
        return run(*args)
    fallback.aten = run  # (the ATen graph without this message: extern_check's fallback after a mismatch)
    return fallback


def _as_is(gm, reason, fallback: bool = False):
    """The ATen graph as it is; ``fallback``: counted as an eager fallback (not for CPU tensors,
    where running the ATen graph is the documented behaviour)."""
    if fallback:
        counters.eager_fallback("native_unsupported", reason)
    counters.bump_compiled("native_graphs.aten")
    fn = gm.forward

    def run(*args):
        return fn(*args)
    run.ember_native = {"reason": reason, "report": None, "cache_hit": False}
    return run


def _compile(gm, example_inputs, opts, renderer="triton"):
    t0 = time.perf_counter()
    use_cache = opts.cache
    base = opts.cache_dir
    key = cache.graph_key(gm, example_inputs, dict(opts.cache_key(), renderer=renderer))
    info = cache.lookup_graph(key, base) if use_cache else None
    counters.bump_compiled(f"native_graphs.{renderer}")  # (a C++ build that fails later counts a fallback too)
    if renderer == "cpp":  # (its units build in the background; the wrapper loads at the first call)
        from ember.native import cpp_graph
        return cpp_graph.deferred(gm, example_inputs, opts, key, info, t0)
    mod = cache.load_wrapper(info, key) if info is not None else None  # (None: a file not to trust)
    hit = mod is not None
    if mod is None:
        runtime.want_builds()  # (the build workers start with the first graph generated, never in a warm start)
        info, wrapper_src, kernel_srcs = _generate(gm, example_inputs, opts, key, base, renderer)
        _emit_log(wrapper_src, kernel_srcs)
        mod = cache.load_module(info["wrapper"], info["wrapper_sha256"])
    if info["device"] != "cpu":  # (the interpreter has nothing to build)
        from ember.native import warm_launch
        # a warm hit takes the kernels its first process recorded (no Triton JIT); what is left builds ahead
        loaded = warm_launch.adopt_recorded(mod, key, base) if hit and use_cache else None
        runtime.precompile(getattr(mod, "LAUNCHES", ()), runtime.compile_threads())
        if use_cache and (loaded is None or loaded.get("kernels_jit")):
            warm_launch.remember(key, base, mod)  # (its kernels are recorded at exit for the next process)
            if hit:  # (kernels that take Triton's JIT at their first launch: its cache key is needed)
                runtime.prewarm_triton_key()
    constants = [_constant(gm, t, info["device"]) for t in info["constants"]]
    call = mod.make_call(constants, _layout_fallback(gm.forward, key))
    call.ember_native = dict(info, cache_hit=hit, compile_s=time.perf_counter() - t0, reason=None)
    if use_cache:  # (what a measured CUDA-graph decision is stored under: ember.cudagraphs.stored)
        call.ember_native.update(key=key, cache_dir=base)
    return call


def _constant(gm, target, device):
    t = getattr(gm, target)
    return t.to(device) if t.device != torch.device(device) and t.numel() == 1 else t


def plan(gm, example_inputs, opts, renderer="triton"):
    """Lower, verify, schedule and emit, without writing or running anything; ``opts``: NativeOptions
    (or a dict of them); ``renderer``: "triton" or "cpp" (the same schedule, spelled in C++).
    Returns (graph IR, lowering, schedule, [(Kernel, EmittedKernel | CppKernel)])."""
    opts = NativeOptions.from_dict(opts)
    from ember.native import cpp_emit, ir, lowering, passes, scheduler, split_reduction, triton_emit
    # (the CPU-only passes rewrite matmuls into Triton templates: not for the C++ path)
    passes.run(gm, opts, on_cpu=not _uses_cuda(gm, example_inputs) and renderer == "triton")
    if renderer == "cpp" and opts.fusion:
        from ember.native import cpu_mm
        cpu_mm.unpermute_rows(gm)  # (a matmul of a row-permuted copy runs on the original, permuted after)
        cpu_mm.fuse_activations(gm)  # (an activation in place on the matmul's result: no second buffer)
        cpu_mm.unfuse_bias(gm)  # (a bias added in the kernel after the matmul, not filled in before it)
        if cpu_mm.small_linears(gm, opts.packed_linear):  # (a few-row Linear in MKL's faster orientation)
            gm = cpu_mm.graph_copy(gm)  # (on a copy: the caller's graph may be compiled again with other options)
            cpu_mm.transpose_small_mm(gm, opts.packed_linear)
    g, L = lowering.lower(gm, example_inputs, libdevice=renderer == "triton")
    if renderer == "cpp":
        _check_cpp_ops(g)
    g = split_reduction.split_reductions(g, opts, renderer)
    if opts.verify:
        ir.verify(g)
    sched = scheduler.schedule(g, opts)
    layouts = g.buffers()
    emit = cpp_emit.emit_kernel if renderer == "cpp" else triton_emit.emit_kernel
    emitted = [(s, emit(s, layouts, opts, g.sizevars)) for s in sched.steps if isinstance(s, scheduler.Kernel)]
    return g, L, sched, emitted


def _check_cpp_ops(g):
    """A graph computing an op the registry routes to ATen on the C++ path (``Op.cpp_aten``) runs
    its ATen code: raises CppUnsupported with the op's reason (the caller logs it)."""
    from ember.native import ops
    if not ops.CPP_ATEN:
        return
    from ember.native.cpp_emit import CppUnsupported
    for n in g.nodes:
        if isinstance(n, ir.ComputedNode):
            for e in ir.walk([n.body]):
                if e.op in ops.CPP_ATEN:
                    raise CppUnsupported(f"{e.op} runs with ATen on the C++ path: {ops.CPP_ATEN[e.op]}")


def _generate(gm, example_inputs, opts, key, base, renderer="triton"):
    from ember.native import triton_emit, wrapper
    g, L, sched, emitted = plan(gm, example_inputs, opts, renderer)
    kernels, by_source, kernel_srcs = {}, {}, []
    if renderer == "cpp":
        kernels, kernel_srcs = _cpp_unit(emitted, base)
        by_source = {ek.source: v[::2] for v in kernels.values() for ek in (v[1],)}
    for step, ek in (emitted if renderer == "triton" else ()):
        if ek.source not in by_source:  # identical kernels are emitted once
            name = triton_emit.kernel_name(step, ek.kind, len(by_source))
            text = kernel_module(name, ek)
            by_source[ek.source] = (name, cache.write_source("kernels", text, base))
            kernel_srcs.append(text)
        name, path = by_source[ek.source]
        kernels[id(step)] = (name, ek, path)
    COUNTERS["graphs"] += 1
    COUNTERS["kernels"] += len(by_source)
    overrides = {}
    # max-autotune: launch configs and matmul choices timed on the device (at static sizes only:
    # symbolic kernels keep the heuristic configs chosen at the hints)
    if opts.autotune and not g.sizevars.symbolic and renderer == "triton":
        from ember.native import autotune
        overrides = autotune.tune(sched, kernels, g.buffers(), opts, L.device)
    if opts.small_mm_flops and renderer == "triton":
        from ember.native import small_mm
        layouts = g.buffers()
        for e in sched.steps:
            if isinstance(e, ir.ExternNode) and e.name not in overrides:
                expr = small_mm.plan(e, layouts, opts)
                if expr is not None:
                    overrides[e.name] = expr
    if opts.packed_linear and renderer == "cpp":
        from ember.native import packed_linear
        layouts, names = g.buffers(), {b.name for b in g.inputs}
        for e in sched.steps:
            if isinstance(e, ir.ExternNode) and e.name not in overrides:
                expr = packed_linear.plan(e, layouts, names)
                if expr is not None:
                    overrides[e.name] = expr
    r = sched.report
    header = (f"graph {key[:16]}: {r['kernels']} {'C++' if renderer == 'cpp' else 'Triton'} kernels, {r['externs']} extern calls, "
              f"{r['bytes']} bytes moved ({r['kernel_bytes']} by kernels)")
    if g.sizevars.symbolic:
        header += "\nsymbolic sizes (bytes counted at the hints):\n" + g.sizevars.describe()
    src = wrapper.WrapperCodegen(sched, kernels, L.int_inputs, header, opts.guard_inputs, boxed=opts.release_inputs,
                                 extern_overrides=overrides).generate()
    info = {"report": r, "kernels": sorted({p for _, p in by_source.values()}),
            "constants": [b.target for b in g.inputs if b.constant is not None],
            "device": str(L.device), "sizes": g.sizevars.describe(), "output_strides": output_strides(g.outputs)}
    info["wrapper"], info["wrapper_sha256"] = cache.store_graph(key, src, info, base), cache.sha(src)
    return info, src, kernel_srcs


def _cpp_unit(emitted, base):
    """A graph's C++ kernels in as few translation units as keep the build workers busy
    (``cpp_build.partition``: one for a small graph, up to one per build thread for a large one;
    identical kernels once), each submitted to its build thread at once. Returns
    ({id(Kernel): (name, CppKernel, unit path)}, [unit sources])."""
    from ember.native import cpp_build, cpp_emit
    names, order = {}, []
    for step, ck in emitted:
        if ck.source not in names:
            names[ck.source] = cpp_emit.kernel_name(step, ck.kind, len(names))
            order.append((names[ck.source], ck))
    paths, texts = {}, []
    for group in cpp_build.partition([len(ck.source) for _, ck in order], runtime.compile_threads()):
        text = cpp_emit.translation_unit([order[i] for i in group])
        path = cpp_build.write_source(text, base)
        cpp_build.submit(path)  # (building while the wrapper is generated)
        texts.append(text)
        paths.update((order[i][1].source, path) for i in group)
    return {id(step): (names[ck.source], ck, paths[ck.source]) for step, ck in emitted}, texts


def output_strides(outputs) -> list | None:
    """The strides of each output of a graph returning a flat tuple (None for a non-tensor or a
    symbolic one): they may differ from eager's (an extern's padded rows, a reused buffer), and a
    backward compiled for the forward's saved tensors must expect these (``aot/pipeline.py``)."""
    from ember.native import ir
    if not isinstance(outputs, (tuple, list)) or any(isinstance(o, (tuple, list)) for o in outputs):
        return None
    return [list(o.strides) if isinstance(o, ir.OutBuf) and all(type(st) is int for st in o.strides) else None
            for o in outputs]


def kernel_module(name, ek) -> str:
    return "\n".join([
        f"# ember native kernel {name} ({ek.kind}): generated code, do not edit",
        ek.comment,
        "import triton",
        "import triton.language as tl",
        "from ember.native.triton_helpers import *  # noqa: F401,F403",
        "",
        "",
        ek.source.replace("KERNEL_NAME", name),
    ])


def _emit_log(wrapper_src, kernel_srcs):
    try:
        from ember.diagnostics import logging as elog
    except ImportError:
        return
    if elog.enabled("output_code"):
        elog.artifact("output_code", "\n\n".join([wrapper_src] + kernel_srcs))
