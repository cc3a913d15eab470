"""A graph of CPU tensors through the C++ renderer, from generated source to the first call.

``backend._compile`` hands a C++ graph here once its key is known (and its cache record, if any).
Generating the code is quick; building it (the system compiler, ~0.5-3 s per unit) is not, so the
units are only *submitted* here (``cpp_build.submit``: build threads run the compiler while this
process goes on) and the returned function binds the kernels (the wrapper's ``make_call``) at its
first call, waiting for the builds then. In a training step the forward graph's unit builds while the backward graph is
traced, lowered and generated, and both build at once.

A unit the compiler refuses (a gap of the renderer: ``cpp_build`` raises) does not fail the call:
the graph runs its ATen code instead, the reason logged and counted as an eager fallback, and
``ember_native["reason"]`` says it (from that call on).
"""
from __future__ import annotations

import threading
import time

from ember import diskcache
from ember.diagnostics import counters
from ember.native import cache, cpp_build


def units(info: dict) -> list:
    """The translation units (``.cpp`` paths) a graph's wrapper loads."""
    return [p for p in info["kernels"] if p.endswith(".cpp")]


def deferred(gm, example_inputs, opts, key, info, t0):
    """``fn(*args)`` for a C++ graph: its wrapper imported (kernels are bound by its ``make_call``),
    its units building in the background until the first call. Raises what code generation raises
    (the caller's fallback)."""
    from ember.native import backend
    mod = cache.load_wrapper(info, key) if info is not None else None  # (None: a file not to trust)
    hit = mod is not None
    if mod is None:
        info, wrapper_src, kernel_srcs = backend._generate(gm, example_inputs, opts, key, opts.cache_dir, "cpp")
        backend._emit_log(wrapper_src, kernel_srcs)
        mod = cache.load_module(info["wrapper"], info["wrapper_sha256"])
    for path in units(info):
        cpp_build.submit(path)
    meta = dict(info, cache_hit=hit, compile_s=time.perf_counter() - t0, reason=None)
    lock, impl = threading.Lock(), []

    def first_call():
        with lock:
            if not impl:
                impl.append(_bind(gm, mod, info, key, meta, opts.cache_dir))
        return impl[0]

    def call(*args):
        return (impl[0] if impl else first_call())(*args)
    call.ember_native = meta
    return call


def _bind(gm, mod, info, key, meta, base=None):
    """The wrapper's ``call`` once the units are built; the ATen graph if a build failed, or if the
    compiler check (``cpp_build.problem``, still running when this graph was generated) failed: then
    the warning says why, once, and the ATen graph is the documented behaviour, not a fallback."""
    from ember.native import backend
    why = cpp_build.problem(base)
    if why is not None:
        meta["reason"] = f"no working C++ compiler, the ATen graph runs: {why}"
        return gm.forward
    try:
        for path in units(info):
            cpp_build.library(path)
    except (RuntimeError, OSError, diskcache.Refused) as e:  # a build the compiler refused: a gap of the renderer
        reason = f"C++ build failed: {type(e).__name__}: {str(e)[:2000]}"
        backend._log(f"ember.native: running the graph as is: {reason}")
        counters.eager_fallback("native_unsupported", reason)
        meta["reason"] = reason
        return gm.forward
    constants = [backend._constant(gm, t, info["device"]) for t in info["constants"]]
    return mod.make_call(constants, backend._layout_fallback(gm.forward, key))
