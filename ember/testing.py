"""Helpers for tests: a counting backend and access to a compiled object's cache."""
from __future__ import annotations

import threading

import torch

from ember.frontend.cache import FrameCache


class CompileCounter:
    """A backend that counts graphs (``frame_count``) and their ops, and runs them eagerly."""

    def __init__(self):
        self.frame_count = 0
        self.op_count = 0
        self.graphs: list = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
        self.graphs.append(gm)
        return gm.forward

    def clear(self):
        self.frame_count = 0
        self.op_count = 0
        self.graphs.clear()


class CompileCounterWithBackend(CompileCounter):
    """A backend that compiles each graph with ``backend`` (a name, with its ``mode``/``options``, or a
    callable) and counts, besides the graphs, the calls of the compiled graphs (``call_count``): a
    program can show that its calls ran compiled code (the TorchServe example reports it per response)."""

    def __init__(self, backend="ember", *, mode=None, options=None):
        super().__init__()
        from ember.api import make_compiler  # the api layer imports this module's neighbours, not this one

        self.backend = make_compiler(backend, mode, dict(options or {}))
        self.backend_name = getattr(self.backend, "ember_backend_name", str(backend))
        self.call_count = 0
        self._lock = threading.Lock()  # calls may come from several threads

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        compiled = self.backend(gm, example_inputs)
        super().__call__(gm, example_inputs)
        compiled = compiled if compiled is not None else gm.forward

        def run(*args):
            with self._lock:
                self.call_count += 1
            return compiled(*args)
        return run

    def clear(self):
        super().clear()
        self.call_count = 0


def cache_of(compiled):
    """The FrameCache behind ``ember.compile(...)``'s result, or of a module compiled in place by
    ``ember.compile_module_``: ``.entries``, ``.recompile_reasons``, ``.compile_count``."""
    cache = getattr(compiled, "_ember_cache", None)
    if cache is None and isinstance(compiled, torch.nn.Module):  # compiled in place (ember.compile_module_)
        cache = compiled.__dict__.get("_compiled_call_impl")
        cache = cache if isinstance(cache, FrameCache) else None
    if cache is None:
        raise TypeError(f"{compiled!r} is not an ember-compiled function or module")
    return cache


class KernelCount:
    """Kernels and extern calls that the native backend's compiled graphs ran, counted per call from
    each graph's report (``ember_native["report"]``): ``with KernelCount() as kc: step()``, then
    ``kc.kernels``, ``kc.externs``, ``kc.graphs`` (graph calls). Graphs compiled inside the block are
    counted; the block rebuilds the ``ember`` backend's compilers, so compile there what you count."""

    def __init__(self):
        self.kernels = self.externs = self.graphs = 0
        self._saved = None

    def reset(self):
        self.kernels = self.externs = self.graphs = 0

    def __enter__(self):
        import ember.native
        from ember.backends import ember_backend

        real = ember.native.compile_aten_graph

        def counting(gm, example_inputs, **kw):
            call = real(gm, example_inputs, **kw)
            report = (getattr(call, "ember_native", None) or {}).get("report") or {}
            k, e = report.get("kernels", 0), report.get("externs", 0)

            def run(*args):
                self.kernels += k
                self.externs += e
                self.graphs += 1
                return call(*args)
            run.ember_native = getattr(call, "ember_native", None)
            return run
        self._saved = (real, ember_backend._native)
        ember.native.compile_aten_graph = counting
        ember_backend._native = {}
        return self

    def __exit__(self, *exc):
        import ember.native
        from ember.backends import ember_backend

        ember.native.compile_aten_graph, ember_backend._native = self._saved
        return False
