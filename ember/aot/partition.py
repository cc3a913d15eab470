"""Split a joint forward+backward graph into a forward graph and a backward graph.

Partitioners share the signature ``partition_fn(joint_gm, joint_inputs, *, num_fwd_outputs) -> (fw, bw)``:
the joint graph takes ``(primals..., tangents...)`` and returns ``(forward outputs..., gradients...)``; the
forward graph takes the primals and returns the forward outputs followed by the values it saves for the
backward; the backward graph takes ``(saved..., tangents...)`` and returns the gradients.

``min_cut_partition`` (the default) keeps activation memory low. Every value the backward reads is
either saved by the forward or recomputed in the backward from other saved values; recomputation is
allowed only for cheap ops (views, pointwise math, copies: ``ops.recompute_rule``). Choosing what to save
is a minimum s-t cut: each forward value v becomes an edge v_in -> v_out whose capacity is what saving v
costs (its bytes; graph inputs cost ~nothing, they are alive anyway), data dependencies are infinite
edges, the source feeds everything that must be computed in the forward (inputs, ops that may not be
recomputed) and every value the backward reads drains to the sink. The cut edges are the saved values;
the forward values on the sink side are recomputed. In the backward graph each recomputed value is
emitted just before its first use, so only one layer's recomputation is alive at a time.
``default_partition`` saves every value the backward reads and recomputes nothing, for comparison.

Each partition carries a ``PartitionSummary`` (``fw_gm.meta["ember_partition"]``) saying what was saved
and recomputed, and why; the dumped graphs print it as a comment block.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
try:  # torch >= 2.13
    from torch.fx.experimental.symbolic_shapes import optimization_hint
except ImportError:  # pragma: no cover - torch 2.11 (the H100 machine)
    def optimization_hint(x):
        return x.node.hint if isinstance(x, torch.SymInt) else int(x)

from ember.aot.lazy_code import text_code
from ember.aot.maxflow import INF, INF_CUT, FlowGraph, min_cut
from ember.aot.ops import is_random_op, recompute_rule


@dataclass
class SavedValue:
    name: str
    spec: str      # e.g. "f32[8, 64]"
    nbytes: int    # 0 for graph inputs: saving them keeps nothing alive that was not alive already
    reason: str


@dataclass
class PartitionSummary:
    strategy: str
    saved: list[SavedValue] = field(default_factory=list)
    recomputed: list[tuple[str, str]] = field(default_factory=list)  # (node, why it may be recomputed)
    deferred: list[tuple[str, str]] = field(default_factory=list)    # forward-only values the backward computes itself
    naive_saved: int = 0     # values the backward reads directly (what default_partition saves)
    naive_bytes: int = 0
    note: str = ""

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self.saved)

    def render(self) -> str:
        lines = [f"partition ({self.strategy}): the forward saves {len(self.saved)} values, "
                 f"{_fmt_bytes(self.saved_bytes)} of activations; saving every value the backward reads "
                 f"would keep {self.naive_saved} values, {_fmt_bytes(self.naive_bytes)}"]
        if self.note:
            lines.append(self.note)
        for s in self.saved:
            lines.append(f"  saved      {s.name:<24} {s.spec:<22} {_fmt_bytes(s.nbytes):>10}  {s.reason}")
        if self.recomputed:
            lines.append(f"  recomputed in the backward ({len(self.recomputed)} ops, cheaper than storing "
                         "their results):")
            for name, why in self.recomputed:
                lines.append(f"  recomputed {name:<24} {why}")
        if self.deferred:
            lines.append(f"  computed by the backward only ({len(self.deferred)} ops that need no tangent but "
                         "feed only the backward: nothing to store):")
            for name, why in self.deferred:
                lines.append(f"  deferred   {name:<24} {why}")
        return "\n".join(lines)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ------------------------------------------------------------------------------------ joint graph facts

class _Joint:
    """The facts both partitioners need: which nodes are forward or backward, and what crosses over."""

    def __init__(self, gm: fx.GraphModule, num_fwd_outputs: int):
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.primals = [n for n in placeholders if not n.name.startswith("tangents")]
        self.tangents = [n for n in placeholders if n.name.startswith("tangents")]
        output = self.nodes[-1]
        assert output.op == "output", "a joint graph ends with its output node"
        outs = list(output.args[0])
        self.fw_outputs, self.grads = outs[:num_fwd_outputs], outs[num_fwd_outputs:]
        # backward nodes: everything that depends on a tangent
        self.backward: set[fx.Node] = set(self.tangents)
        for n in self.nodes:
            if n.op == "call_function" and any(a in self.backward for a in n.all_input_nodes):
                self.backward.add(n)
        # forward values the backward reads (in graph order)
        needed: dict[fx.Node, None] = {}
        for n in self.nodes:
            if n in self.backward and n.op == "call_function":
                for a in n.all_input_nodes:
                    if a not in self.backward:
                        needed[a] = None
        for g in self.grads:
            if isinstance(g, fx.Node) and g not in self.backward:
                needed[g] = None
        position = {n: i for i, n in enumerate(self.nodes)}
        self.needed = sorted(needed, key=position.__getitem__)


def _val(node: fx.Node):
    return node.meta.get("val")


def _spec(node: fx.Node) -> str:
    v = _val(node)
    if isinstance(v, torch.Tensor):
        dt = str(v.dtype).replace("torch.", "")
        short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
                 "int32": "i32", "bool": "b8", "uint8": "u8"}.get(dt, dt)
        return f"{short}{list(v.shape)}"
    return type(v).__name__


def _nbytes(node: fx.Node) -> float:
    """What keeping this value alive for the backward costs."""
    if node.op == "get_attr":
        return 0.0  # a constant held by the graph module itself
    if node.op == "placeholder":
        # the caller holds its inputs anyway; a mutated one is overwritten by the runtime, so it can't be kept
        return INF if node.meta.get("ember_mutated_input") else 0.0
    v = _val(node)
    if isinstance(v, torch.Tensor):
        # symbolic sizes: the size hint (int() would add a guard, specializing the graph to one size)
        return float(optimization_hint(v.numel()) * v.element_size())
    return INF  # tuples and other non-tensors cannot be saved as such; their elements can


def _ancestors(nodes: list[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


def _extract(gm: fx.GraphModule, inputs: list[fx.Node], outputs: list, name: str,
             lazy: set[fx.Node] | None = None, keep: list[fx.Node] = ()) -> fx.GraphModule:
    """A new graph computing ``outputs`` (and the side effects ``keep``) from ``inputs`` with the
    original nodes, in their original order, except that ``lazy`` nodes are emitted just before their
    first user (see ``_build``)."""
    needed: set[fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, fx.Node)] + list(keep)
    boundary = set(inputs)
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        if n not in boundary:
            stack.extend(n.all_input_nodes)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in inputs:
        env[n] = graph.placeholder(n.name)
        env[n].meta = dict(n.meta)

    def emit(node: fx.Node) -> None:
        # iterative post-order: a node's inputs first, then the node
        work = [(node, False)]
        while work:
            n, ready = work.pop()
            if n in env:
                continue
            if n.op == "placeholder":
                raise RuntimeError(f"ember partitioner bug: {name} graph needs {n.name}, which it does not receive")
            if ready:
                env[n] = graph.node_copy(n, lambda a: env[a])
                continue
            work.append((n, True))
            work.extend((a, False) for a in reversed(n.all_input_nodes) if a not in env)

    lazy = lazy or set()
    for n in gm.graph.nodes:
        if n in needed and n not in lazy and n.op != "output":
            emit(n)
    for o in outputs:  # lazy values returned as they are
        if isinstance(o, fx.Node):
            emit(o)
    graph.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs))
    # (lazy: the code is generated as text when first read, compiled when run; see ``lazy_code``)
    out = text_code(gm, graph, class_name=name)
    out._ember_name = name
    return out


def _writes_to_input(n: fx.Node, primals: set) -> bool:
    """Does ``n`` write in place to a graph input (through views too)? Functionalization turns the
    mutations it sees into outputs copied back after the call; this is what it did not see, e.g. a
    decomposition below it writing BatchNorm's running statistics with ``copy_`` (CUDA's batch norm)."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    for k, arg in enumerate(n.target._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        a = n.args[k] if k < len(n.args) else n.kwargs.get(arg.name)
        while isinstance(a, fx.Node) and a.op == "call_function" and a.args and \
                isinstance(a.target, torch._ops.OpOverload) and a.target.is_view:
            a = a.args[0]
        if a in primals:
            return True
    return False


def _build(joint: _Joint, saved: list[fx.Node], summary: PartitionSummary):
    # Side effects nobody reads stay in the graph (forward or backward) they belong to: a random op
    # still advances the generator, as it did in eager, and an in-place write to an input (BatchNorm's
    # running statistics, when functionalization did not see it) still updates the input.
    primals = set(joint.primals)
    random = [n for n in joint.nodes if n.op == "call_function" and is_random_op(n.target)]
    writes = [n for n in joint.nodes if n not in joint.backward and _writes_to_input(n, primals)]
    fw = _extract(joint.gm, joint.primals, joint.fw_outputs + saved, "forward",
                  keep=[n for n in random + writes if n not in joint.backward])
    # In the joint graph the recomputed forward values come before the whole backward; emitted there,
    # every layer's recomputation would be alive at once when the backward starts. Emitting each one
    # just before its first use keeps only the current layer's alive, as eager autograd does.
    recomputed = {n for n in joint.nodes if n not in joint.backward and n.op == "call_function"}
    bw = _extract(joint.gm, saved + joint.tangents, joint.grads, "backward", lazy=recomputed,
                  keep=[n for n in random if n in joint.backward])
    fw.meta["ember_partition"] = bw.meta["ember_partition"] = summary
    return fw, bw


def _naive_cost(joint: _Joint) -> tuple[int, int]:
    return len(joint.needed), int(sum(_nbytes(n) for n in joint.needed if _nbytes(n) < INF_CUT))


# ------------------------------------------------------------------------------------------ partitioners

def default_partition(joint_gm: fx.GraphModule, joint_inputs=None, *, num_fwd_outputs: int):
    """Save every forward value the backward reads; recompute nothing."""
    joint = _Joint(joint_gm, num_fwd_outputs)
    count, nbytes = _naive_cost(joint)
    summary = PartitionSummary("save all", naive_saved=count, naive_bytes=nbytes)
    for n in joint.needed:
        reason = "graph input" if n.op == "placeholder" else "read by the backward"
        summary.saved.append(SavedValue(n.name, _spec(n), int(_nbytes(n)) if n.op != "placeholder" else 0, reason))
    return _build(joint, list(joint.needed), summary)


def min_cut_partition(joint_gm: fx.GraphModule, joint_inputs=None, *, num_fwd_outputs: int):
    """Save the cheapest set of values from which the backward can recompute what it reads."""
    joint = _Joint(joint_gm, num_fwd_outputs)
    count, nbytes = _naive_cost(joint)
    if not joint.needed:
        return _build(joint, [], PartitionSummary("min-cut", naive_saved=0, naive_bytes=0))

    # the region that matters: forward ancestors of what the backward reads
    region: set[fx.Node] = set()
    stack = list(joint.needed)
    while stack:
        n = stack.pop()
        if n not in region:
            region.add(n)
            stack.extend(a for a in n.all_input_nodes if a not in joint.backward)
    order = [n for n in joint.nodes if n in region]

    flow = FlowGraph()
    source, sink = flow.vertex("source"), flow.vertex("sink")
    v_in, v_out, rules = {}, {}, {}
    needed = set(joint.needed)
    for n in order:
        v_in[n], v_out[n] = flow.vertex((n, "in")), flow.vertex((n, "out"))
        flow.add_edge(v_in[n], v_out[n], _nbytes(n))
        if n.op == "placeholder":
            rules[n] = (False, "graph input")
        elif n.op == "get_attr":
            rules[n] = (True, "constant of the graph module")
        else:
            rules[n] = recompute_rule(n.target, n, joint.backward)
        if not rules[n][0]:
            flow.add_edge(source, v_in[n], INF)  # must come from the forward
        for a in n.all_input_nodes:
            if a in region:
                flow.add_edge(v_out[a], v_in[n], INF)
        if n in needed:
            flow.add_edge(v_out[n], sink, INF)

    value, side = min_cut(flow, source, sink)
    if value >= INF_CUT:
        fw, bw = default_partition(joint_gm, joint_inputs, num_fwd_outputs=num_fwd_outputs)
        fw.meta["ember_partition"].note = "min-cut found no finite cut (a non-tensor value is read by the backward); saved everything"
        return fw, bw

    # Walk back from what the backward reads: a value on the source side is saved (its in->out edge is
    # cut); one on the sink side is recomputed, and so are the values it is computed from, in turn.
    saved_set, recomputed, stack = set(), set(), list(joint.needed)
    while stack:
        n = stack.pop()
        if n in saved_set or n in recomputed:
            continue
        if v_in[n] in side:
            saved_set.add(n)
        else:
            recomputed.add(n)
            stack.extend(a for a in n.all_input_nodes if a in region)
    saved = [n for n in order if n in saved_set]
    summary = PartitionSummary("min-cut", naive_saved=count, naive_bytes=nbytes)
    for n in saved:
        summary.saved.append(SavedValue(n.name, _spec(n), int(_nbytes(n)), _why_saved(n, rules)))
    in_forward = _ancestors([o for o in joint.fw_outputs if isinstance(o, fx.Node)])
    for n in order:
        if n in recomputed:
            target = getattr(n.target, "__name__", str(n.target))
            entry = (n.name, f"{target} ({rules[n][1]}), {_spec(n)}")
            (summary.recomputed if n in in_forward else summary.deferred).append(entry)
    return _build(joint, saved, summary)


def _why_saved(n: fx.Node, rules) -> str:
    ok, why = rules[n]
    if n.op == "placeholder":
        return "graph input: alive anyway, saving it costs nothing"
    producer = n.args[0] if n.target is operator.getitem and isinstance(n.args[0], fx.Node) else None
    if producer is not None and producer in rules and not rules[producer][0]:
        return f"output of {producer.name}, not recomputable: {rules[producer][1]}"
    if not ok:
        return f"not recomputable: {why}"
    return f"{why}; cheaper to save than what recomputing it would need"
