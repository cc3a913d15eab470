"""The FX rewrite ``act(addmm(bias, x, w))`` -> ``_addmm_activation(bias, x, w, use_gelu=...)`` that both
matmul passes make: ``cpu_mm.fuse_activations`` (ReLU or erf GELU, applied in place after MKL's GEMM) and
``cuda_mm.fuse_tanh_gelu`` (tanh GELU in cuBLASLt's epilogue). Their modules say why each pays.

The two differ only in which addmms qualify (a predicate) and which activations they recognise (a table
of ``Epilogue`` rows, one matcher each); ``fuse`` is the one routine that walks the graph and rewrites.
What it checks itself is what makes the rewrite sound on any device:

* views between the matmul and the activation (a 3-D Linear's result viewed back to 3-D, as GPT-2's and
  the encoder's graphs have) are re-applied to the fused op's result: a view commutes with a pointwise op;
* nothing outside the activation uses the pre-activation value or a piece of the formula: the fused op
  never materialises them (a training forward saves the pre-activation for the backward, and that extra
  user stops the rewrite);
* the activation's result has the matmul's dtype and the pre-activation's shape: ``_addmm_activation``
  returns exactly that, so a match that widened or broadcast would change the graph's values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ember.native.fx_match import is_call

aten = torch.ops.aten

VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)  # (commute with a pointwise op)


@dataclass(frozen=True)
class Epilogue:
    """One activation ``_addmm_activation`` can apply: ``match(pre)`` gives (the node computing
    act(pre), the formula's other nodes) or None."""
    name: str
    match: Callable[[torch.fx.Node], tuple | None]
    use_gelu: bool  # (_addmm_activation's flag: GELU, else ReLU; which GELU is the device's: see cuda_mm)


def relu_of(pre):
    """(``relu(pre)``, []) when that is the only use of ``pre``; else None."""
    relu = [u for u in pre.users if is_call(u, aten.relu.default, pre)]
    return (relu[0], []) if relu and len(pre.users) == 1 else None


def fuse(gm: torch.fx.GraphModule, qualifies: Callable[[torch.fx.Node], bool], epilogues) -> int:
    """``act(addmm(bias, x, w))`` -> ``_addmm_activation(bias, x, w, use_gelu=...)`` for every addmm node
    ``qualifies`` accepts whose activation (through views) a row of ``epilogues`` matches, first row
    first (module docstring). Returns the count."""
    g, fused = gm.graph, 0
    for n in list(g.nodes):
        if not qualifies(n):
            continue
        views, pre = [], n  # a 3-D Linear's result is viewed back to 3-D before its activation
        while len(pre.users) == 1 and next(iter(pre.users)).target in VIEWS:
            pre = next(iter(pre.users))
            views.append(pre)
        found = _match(pre, epilogues)
        if found is None:
            continue
        out, inner, use_gelu = found
        val, pre_val = out.meta.get("val"), pre.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(pre_val, torch.Tensor) \
                or val.dtype != n.meta["val"].dtype or val.shape != pre_val.shape:
            continue
        with g.inserting_before(out):
            new = g.call_function(aten._addmm_activation.default, tuple(n.args), {"use_gelu": use_gelu})
            new.meta = dict(n.meta)
            for v in views:  # the same views, now of the activation's result
                new = g.call_function(v.target, (new, *v.args[1:]), dict(v.kwargs))
                new.meta = dict(v.meta)
        out.replace_all_uses_with(new)
        for dead in [out, *reversed(inner), *reversed(views), n]:
            g.erase_node(dead)
        fused += 1
    if fused:
        g.lint()
        gm.recompile()
    return fused


def _match(pre, epilogues):
    """(out, inner, use_gelu) of the first row of ``epilogues`` that matches at ``pre`` with no use of
    ``pre`` or of the formula's inner nodes outside the formula; else None."""
    for e in epilogues:
        m = e.match(pre)
        if m is None:
            continue
        out, inner = m
        formula = {out, *inner}
        if set(pre.users) <= formula and all(set(u.users) <= formula for u in inner):
            return out, list(inner), e.use_gelu
    return None
