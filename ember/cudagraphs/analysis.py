"""What a graph must not contain to be captured, read from the FX graph and its example inputs.

A CUDA graph replays the kernels it recorded and nothing else. So a graph is not captured when
part of its work is not a kernel on the GPU (CPU tensors: their values would be frozen at capture),
when its sizes are symbolic (one capture holds one set of sizes), or when it asks the host for a
value (``.item()``, ``nonzero``: a synchronization, which capture forbids), or when it runs attention
with dropout (below). Inputs the graph writes
in place are returned separately: those must be static (the runner checks at recording time).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ember.cudagraphs.pool import liveness_supported

# ops that wait for a device value on the host, or size their output by the data
SYNC_OPS = frozenset({
    "_local_scalar_dense", "item", "nonzero", "nonzero_static", "masked_select", "unique", "_unique", "_unique2",
    "unique_consecutive", "unique_dim", "equal", "is_nonzero", "allclose", "bincount", "histc", "tolist",
    "_assert_async",
})


def _attention_dropout(n: fx.Node) -> float:
    """The ``dropout_p`` of an attention op (SDPA and its efficient/flash/cuDNN kernels, forward and
    backward), else 0. Why such a graph is not captured: with dropout, the forward kernel returns the
    philox seed and offset it drew from as *host* tensors when it runs normally but as *device* tensors
    (pointers into the graph's RNG state) under capture, and the backward reads them the way they were
    made. A forward replayed from a graph and a backward run normally (a graph that did not qualify,
    a warm-up or a fallback call) then dereferences a device pointer on the host: a segfault, as seen
    with GPT-2 training under automatic CUDA graphs. Capturing both halves in lockstep would work until
    the first call that falls back, so neither half is captured."""
    target = n.target
    if not isinstance(target, torch._ops.OpOverload):
        return 0.0
    for k, arg in enumerate(target._schema.arguments):
        if arg.name == "dropout_p":
            v = n.args[k] if k < len(n.args) else n.kwargs.get("dropout_p", arg.default_value)
            return float(v) if isinstance(v, (int, float)) else 1.0  # (symbolic: assume dropout)
    return 0.0


def _op_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::")[-1]
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", "")


def _symbolic(v) -> bool:
    if isinstance(v, torch.SymInt):
        return True
    if isinstance(v, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in v.shape)
    return False


def skip_reason(gm: fx.GraphModule | None, example_inputs, api, facts: list | None = None) -> str | None:
    """Why the graph cannot be captured, or None. ``facts``: ``capture_facts`` of the graph, read
    instead of ``gm``'s nodes (a cached graph's, stored with it: a warm start does not build them)."""
    if not liveness_supported():
        return "this torch cannot tell whether a caller still holds a graph output (no torch._C._storage_Use_Count)"
    on_device = False
    for i, x in enumerate(example_inputs):
        if _symbolic(x):
            return f"dynamic shapes (input {i} has symbolic sizes)"
        if isinstance(x, torch.Tensor):
            if not api.is_graph_tensor(x):
                return f"input {i} is a {x.device.type} tensor"
            on_device = True
    if facts is None and gm is not None:
        facts = capture_facts(gm)
    for fact in facts or ():
        if fact[0] == "problem":
            return fact[1]
        _, node, name, t = fact
        if not api.is_graph_tensor(t):
            return f"{node} ({name}) makes a {t.device.type} tensor"
        on_device = True
    if not on_device and (example_inputs or facts is not None):
        return "no CUDA tensors"
    return None  # (with nothing to look at, the runner checks each call's inputs)


def capture_facts(gm: fx.GraphModule) -> list:
    """What ``skip_reason`` reads of the graph's nodes, in node order: ("problem", why) for the first
    node that rules a capture out whatever the device (symbolic sizes, a host synchronization; nothing
    after it), and ("tensor", node, op, value) for the first value on each device before it. A graph API
    tells graph tensors by their device (``TorchCuda``: CUDA ones), so the first value of each device
    answers for all of that device's values: the first one it refuses is the one a scan of every node
    would name. Plain data, stored with a cached graph (``ember.aot.deferred.summary_of``)."""
    facts, devices = [], set()
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder":
            if _symbolic(v):
                facts.append(("problem", f"dynamic shapes ({n.name} has symbolic sizes)"))
                return facts
            continue
        if n.op not in ("call_function", "call_method"):
            continue
        name = _op_name(n.target)
        if name in SYNC_OPS or (name == "index" and _bool_index(n)):
            facts.append(("problem", f"{name} ({n.name}) waits for a device value on the host"))
            return facts
        if _attention_dropout(n):
            facts.append(("problem", f"{name} ({n.name}) runs attention dropout: its philox seed is a host "
                                     "tensor outside a capture and a device tensor inside one"))
            return facts
        for t in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(t, torch.Tensor) and str(t.device) not in devices:
                devices.add(str(t.device))
                facts.append(("tensor", n.name, name, t))
    return facts


def _bool_index(n: fx.Node) -> bool:
    """x[mask]: the output size is the number of True values."""
    idx = n.args[1] if len(n.args) > 1 else []
    return any(isinstance(i, fx.Node) and isinstance(i.meta.get("val"), torch.Tensor)
               and i.meta["val"].dtype in (torch.bool, torch.uint8) for i in idx or [])


def _is_view(target) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return False
    rets = target._schema.returns
    return len(rets) == 1 and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def mutated_inputs(gm: fx.GraphModule | None) -> frozenset:
    """Positions of the placeholders the graph writes to in place (through views too)."""
    if gm is None:
        return frozenset()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {n: i for i, n in enumerate(placeholders)}

    def root(a):
        while isinstance(a, fx.Node) and a.op == "call_function" and _is_view(a.target) and a.args:
            a = a.args[0]
        return a

    out = set()
    for n in gm.graph.nodes:
        written = []
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            schema = n.target._schema
            for k, arg in enumerate(schema.arguments):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    written.append(n.args[k] if k < len(n.args) else n.kwargs.get(arg.name))
        elif n.op == "call_method" and n.target.endswith("_") and not n.target.endswith("__") and n.args:
            written.append(n.args[0])
        for w in written:
            r = root(w)
            if r in index:
                out.add(index[r])
    return frozenset(out)
