"""The fallback for graphs with symbolic sizes that the native backend cannot compile symbolically.

Such a graph (see ``backend.compile_aten_graph`` for when) is compiled once per distinct set of input
sizes it meets, at its first call with those sizes: the frontend does not recompile (its guards
cover every size), only this layer generates kernels again.
"""
from __future__ import annotations

import warnings

import torch
from torch.fx.experimental.proxy_tensor import make_fx


class PerShapeGraph:
    """``fn(*args)`` for a symbolic graph: a static copy per input-size key, compiled on first use."""

    def __init__(self, gm: torch.fx.GraphModule, compile_static, reason: str):
        self.gm = gm
        self.compile_static = compile_static
        self.compiled: dict = {}
        self.ember_native = {"reason": f"symbolic sizes, compiled per input sizes: {reason}", "report": None,
                             "cache_hit": False}

    @staticmethod
    def _key(args) -> tuple:
        return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                     for a in args)

    def __call__(self, *args):
        key = self._key(args)
        fn = self.compiled.get(key)
        if fn is None:
            fn = self._compile(key, args)
        return fn(*args)

    def _compile(self, key, args):
        from ember.diagnostics import counters
        from ember.locks import COMPILE_LOCK
        from ember.native.backend import COUNTERS
        with COMPILE_LOCK:  # make_fx is not thread-safe (ember/locks.py); another thread may have compiled it
            fn = self.compiled.get(key)
            if fn is not None:
                return fn
            try:
                with torch.no_grad():
                    static = make_fx(self.gm, tracing_mode="fake")(*args)
                fn = self.compiled[key] = self.compile_static(static, list(args))
            except Exception as e:  # noqa: BLE001 - at call time nothing above catches it: run the graph as is
                sizes = [k[0] for k in key if isinstance(k, tuple)]
                counters.eager_fallback("native_per_shape", f"input sizes {sizes}: {type(e).__name__}: {e}")
                warnings.warn(f"ember.native: running a graph eagerly for input sizes {sizes}, "
                              f"compiling it failed with {type(e).__name__}: {e}")
                fn = self.compiled[key] = self.gm.forward
            COUNTERS["per_shape"] += 1
        return fn
