"""Turn out-of-place ops of a functional ATen graph back into in-place ones where nobody can tell.

Functional graphs allocate a fresh buffer for every result. Eager autograd does not: embedding's
backward accumulates into one zeros tensor, and a parameter used twice gets its second gradient added
into the first. Run as they are, functional backward graphs would need a couple of extra
gradient-sized buffers at their peak. This pass is for graphs *run* eagerly (``run_graph_eagerly``);
the graphs handed to compilers and dumped stay functional.

An op ``f(self, ...)`` becomes ``f_(self, ...)`` when:
- ATen has that in-place overload with the same arguments, and the op is not random (an in-place draw
  fills memory in another order than the out-of-place one; see ``functional._Functionalizer``);
- ``self`` is an intermediate the graph allocated itself (not an input, constant, or a view of one),
  and is not itself a view (its base could be read later);
- nothing reads ``self``'s storage (through any alias) after this op;
- the result has exactly ``self``'s shape, dtype and strides (no broadcasting or type promotion).
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ember.aot.ops import VIEW_OPS, is_random_op


def _inplace_variant(op):
    if not isinstance(op, torch._ops.OpOverload) or is_random_op(op):
        return None
    packet = getattr(torch.ops.aten, op._schema.name.split("::")[-1] + "_", None)
    inplace = getattr(packet, op._overloadname, None) if packet is not None else None
    if inplace is None:
        return None
    names = [a.name for a in op._schema.arguments]
    if [a.name for a in inplace._schema.arguments] != names or not names or names[0] != "self":
        return None
    return inplace


# f(a, b) == f(b, a) for these overloads (add's alpha must be 1), so the dead operand may be either one
COMMUTATIVE = {torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor, torch.ops.aten.maximum.default,
               torch.ops.aten.minimum.default, torch.ops.aten.bitwise_and.Tensor, torch.ops.aten.bitwise_or.Tensor,
               torch.ops.aten.logical_and.default, torch.ops.aten.logical_or.default}


def _aliases_input(n: fx.Node) -> bool:
    """Does this node's result share storage with its first argument?"""
    op = n.target
    if op is operator.getitem:
        return True  # an element of a multi-output op: decided by the op (see below)
    if not isinstance(op, torch._ops.OpOverload):
        return True  # unknown callables: assume the worst
    if op.overloadpacket in VIEW_OPS:
        return True
    return any(r.alias_info is not None for r in op._schema.returns)


def _same_layout(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype and a.stride() == b.stride() and a.device == b.device)


def reinplace(gm: fx.GraphModule) -> int:
    """Rewrite ``gm`` in place; returns how many ops became in-place."""
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    parent: dict[fx.Node, fx.Node] = {}  # union-find over allocations: a node's result lives in find(node)
    is_view: set[fx.Node] = set()

    def find(n: fx.Node) -> fx.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in nodes:
        parent[n] = n
        if n.op == "call_function" and n.args and isinstance(n.args[0], fx.Node) and _aliases_input(n):
            src = n.args[0]
            if not (n.target is operator.getitem and find(src) is src and src not in is_view):
                parent[n] = find(src)  # (an element of a fresh tuple such as var_mean's owns its storage)
                is_view.add(n)
    last_use: dict[fx.Node, int] = {}    # per allocation: the last node reading any alias of it
    for n in nodes:
        r = find(n)
        last_use[r] = max(last_use.get(r, -1), index[n], *(index[u] for u in n.users))
    protected = {n for n in nodes if n.op in ("placeholder", "get_attr")}

    def _can_overwrite(a) -> bool:
        return isinstance(a, fx.Node) and a not in is_view and find(a) not in protected

    def overwritable(n: fx.Node, a) -> bool:
        if not isinstance(a, fx.Node) or a in is_view or find(a) in protected:
            return False
        owner = find(a)
        if any(find(b) is owner for b in n.all_input_nodes if b is not a):
            return False  # another argument reads the memory being overwritten (e.g. add(x, x.t()))
        return last_use[owner] <= index[n] and _same_layout(n.meta.get("val"), a.meta.get("val"))

    count = 0
    for n in nodes:
        if n.op != "call_function" or not n.args or n in is_view:
            continue
        inplace = _inplace_variant(n.target)
        if inplace is None:
            continue
        if not overwritable(n, n.args[0]):
            swappable = n.target in COMMUTATIVE and n.kwargs.get("alpha", 1) == 1 and len(n.args) >= 2
            if not (swappable and overwritable(n, n.args[1])):
                continue
            n.args = (n.args[1], n.args[0], *n.args[2:])  # add(view, fresh) -> add_(fresh, view)
        owner = find(n.args[0])
        n.target = inplace
        mine = find(n)
        parent[mine] = owner
        last_use[owner] = max(last_use[owner], last_use[mine])
        count += 1
    if count:
        gm.recompile()
    return count
