"""Graphs with symbolic sizes (dynamic shapes) on the native backend.

The code generator works on concrete sizes. A graph traced with symbolic sizes is therefore compiled
once per distinct set of input sizes it actually meets, at its first call with those sizes: the
frontend does not recompile (its guards cover every size), only this layer generates kernels again.
Kernels taking their sizes as arguments, valid for every size, are the planned replacement.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx


def has_symbolic_inputs(gm: torch.fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt) and v.node.expr.free_symbols:
            return True
        if isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) and s.node.expr.free_symbols
                                               for s in (*v.shape, *v.stride())):
            return True
    return False


class PerShapeGraph:
    """``fn(*args)`` for a symbolic graph: a static copy per input-size key, compiled on first use."""

    def __init__(self, gm: torch.fx.GraphModule, compile_static):
        self.gm = gm
        self.compile_static = compile_static
        self.compiled: dict = {}
        self.ember_native = {"reason": "symbolic sizes: compiled per input sizes", "report": None,
                             "cache_hit": False}

    @staticmethod
    def _key(args) -> tuple:
        return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                     for a in args)

    def __call__(self, *args):
        key = self._key(args)
        fn = self.compiled.get(key)
        if fn is None:
            with torch.no_grad():
                static = make_fx(self.gm, tracing_mode="fake")(*args)
            fn = self.compiled[key] = self.compile_static(static, list(args))
        return fn(*args)
