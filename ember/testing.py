"""Helpers for tests: a counting backend and access to a compiled object's cache."""
from __future__ import annotations

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
