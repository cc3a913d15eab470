"""Does a graph traced size-obliviously also hold at size 1? (dynamic.py: "size-oblivious ones").

Tracing a symbol size-obliviously lets torch's library code take its general branch on "is this size
1?" without a guard (``guard_or_false``). Most such sites are right for 1 too (contiguity tests,
broadcasting, which checks with ``torch._check`` and so guards), but not all: ``x.squeeze(0)``
keeps the dimension in the general branch and drops it at 1. So before a graph may serve size 1,
it is propagated once more with static fake tensors in which every oblivious symbol is 1 (and
every other symbol its traced value): each node must give the shape (and, for dimensions that are
not 1, the strides) the symbolic trace predicts at 1. One mismatch, or an op that fails at 1, and
the symbols' ranges start at 2 again (the usual guard; a size-1 call recompiles). Cost: one fake
propagation of the graph, only at the recompile that made a size-1 dimension symbolic.
"""
from __future__ import annotations

import sympy
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree


class _Mismatch(Exception):
    pass


def holds_at_one(gm: fx.GraphModule, env, oblivious: set) -> str | None:
    """None when every node of ``gm`` behaves at size 1 of the ``oblivious`` symbols as its symbolic
    trace says; else what differs (for the log)."""
    hints = getattr(env, "backed_var_to_val", None) or env.var_to_val
    subs = {s: sympy.Integer(1) if s in oblivious else sympy.Integer(int(v)) for s, v in hints.items()}

    def concrete(v):
        if isinstance(v, torch.SymInt):
            return int(env.replace(v.node.expr).xreplace(subs))
        return int(v)

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    values: dict = {}

    def load(v):
        if isinstance(v, torch.Tensor):
            with mode:
                return torch.empty_strided([concrete(d) for d in v.shape], [concrete(d) for d in v.stride()],
                                           dtype=v.dtype, device=v.device, requires_grad=v.requires_grad)
        return concrete(v) if isinstance(v, torch.SymInt) else v

    def check(node, got, want):
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                raise _Mismatch(f"{node.format_node()}: a {type(got).__name__} at size 1")
            shape = [concrete(d) for d in want.shape]
            if list(got.shape) != shape or got.dtype != want.dtype:
                raise _Mismatch(f"{node.format_node()}: shape {tuple(got.shape)} at size 1, {tuple(shape)} traced")
            stride = [concrete(d) for d in want.stride()]
            if any(n > 1 and a != b for n, a, b in zip(shape, got.stride(), stride)):
                raise _Mismatch(f"{node.format_node()}: strides {got.stride()} at size 1, {tuple(stride)} traced")
        elif isinstance(want, torch.SymInt) and concrete(want) != got:
            raise _Mismatch(f"{node.format_node()}: {got} at size 1, {concrete(want)} traced")
        elif isinstance(want, (tuple, list)):
            if not isinstance(got, (tuple, list)) or len(got) != len(want):
                raise _Mismatch(f"{node.format_node()}: {type(got).__name__} at size 1")
            for g, w in zip(got, want):
                check(node, g, w)

    for node in gm.graph.nodes:  # these would change the process's autocast state for real
        if node.op == "call_function" and getattr(node.target, "__name__", "") in _GLOBAL_STATE_NODES:
            return f"{node.format_node()}: not propagated again (it changes global state)"
    grad = torch.is_grad_enabled()  # (a _set_grad_enabled node switches it for real)
    try:
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                values[node] = load(node.meta.get("example_value"))
                continue
            if node.op == "output":
                break
            args, kwargs = pytree.tree_map_only(fx.Node, lambda n: values[n], (node.args, node.kwargs))
            with mode:
                if node.op == "call_function":
                    out = node.target(*args, **kwargs)
                elif node.op == "call_method":
                    out = getattr(args[0], node.target)(*args[1:], **kwargs)
                elif node.op == "get_attr":
                    out = load(getattr(gm, node.target))
                else:
                    raise _Mismatch(f"{node.op} node {node.name}")
            if "example_value" in node.meta:
                check(node, out, node.meta["example_value"])
            values[node] = out
    except _Mismatch as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure at 1 means: do not serve 1
        return f"{type(exc).__name__}: {exc}"[:300]
    finally:
        torch._C._set_grad_enabled(grad)
    return None


_GLOBAL_STATE_NODES = frozenset({"_enter_autocast", "_exit_autocast"})
