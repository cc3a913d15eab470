"""Small FX pattern matchers shared by the native backend's graph passes (small_mm's Triton epilogues,
cpu_mm's ATen epilogues); no Triton import here, so the C++ path can use them."""
from __future__ import annotations

import torch

aten = torch.ops.aten


def is_call(n, target, *args) -> bool:
    return (isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target is target
            and len(n.args) == len(args) and all(x is None or x == y for x, y in zip(args, n.args)) and not n.kwargs)


def gelu_of(pre):
    """The node computing erf-GELU of ``pre`` in its decomposed form, ``(pre * 0.5) * (erf(pre *
    M_SQRT1_2) + 1)``, with the intermediate nodes used only there; else None."""
    users = list(pre.users)
    half = [u for u in users if is_call(u, aten.mul.Tensor, pre, 0.5)]
    scaled = [u for u in users if is_call(u, aten.mul.Tensor, pre, 0.7071067811865476)]
    if len(half) != 1 or len(scaled) != 1 or len(scaled[0].users) != 1 or len(half[0].users) != 1:
        return None
    erf = next(iter(scaled[0].users))
    if not is_call(erf, aten.erf.default, scaled[0]) or len(erf.users) != 1:
        return None
    plus = next(iter(erf.users))
    if not is_call(plus, aten.add.Tensor, erf, 1) or len(plus.users) != 1:
        return None
    out = next(iter(plus.users))
    if out is not next(iter(half[0].users)) or out.op != "call_function" or out.target is not aten.mul.Tensor \
            or set(out.args) != {half[0], plus} or out.kwargs:
        return None
    return out, [half[0], scaled[0], erf, plus]
