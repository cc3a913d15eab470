"""The report of ``ember.explain(fn)(*args, **kwargs)`` (which lives in ``ember/api.py``: it drives a
compile, and diagnostics sit below what they report on): the graphs, each graph break with its reason
and the user's file:line, ops per graph, the guards of each cache entry, and recompile reasons.
``print(report)`` is meant to be read by people.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GraphReport:
    function: str
    op_count: int
    ops: list          # op names in graph order
    code: str          # the FX graph's readable code
    split: str = ""    # a part of a split graph (the DDP bucketing pass): which part, and why
    calls: int = 0     # how often it ran during the explained call


@dataclass
class EntryReport:
    function: str
    guards: list       # one line per guard: "<value>: <kind>"
    breaks: list       # BreakRecord(s) ending this entry


@dataclass
class ExplainReport:
    graphs: list = field(default_factory=list)
    entries: list = field(default_factory=list)
    recompile_reasons: list = field(default_factory=list)
    fallbacks: list = field(default_factory=list)  # callables run eagerly as a whole, with the reason
    # loops that run as Python with their body compiled: "fn: for loop at line N (file:line)" -> the
    # numbers (1-based) of the graphs their body runs in each iteration
    loops: dict = field(default_factory=dict)
    out: Any = None

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def split_graph_count(self) -> int:
        """Graphs that are parts of a graph split at DDP's buckets."""
        return sum(1 for g in self.graphs if g.split)

    @property
    def break_reasons(self) -> list:
        return [b for e in self.entries for b in e.breaks]

    @property
    def graph_break_count(self) -> int:
        return len(self.break_reasons)

    @property
    def ops_per_graph(self) -> list:
        return [g.ops for g in self.graphs]

    @property
    def op_count(self) -> int:
        return sum(g.op_count for g in self.graphs)

    def __str__(self) -> str:
        lines = [f"ember.explain: {self.graph_count} graph(s), {self.graph_break_count} graph break(s), "
                 f"{self.op_count} op(s)"]
        if self.break_reasons:
            lines.append("Graph breaks:")
            lines += [f"  {i}. {b.location}\n     {b.reason}" for i, b in enumerate(self.break_reasons, 1)]
        if self.fallbacks:
            lines.append("Run eagerly as a whole:")
            lines += [f"  {name}: {why}" for name, why in self.fallbacks]
        if self.loops:
            lines.append("Loops that run as Python, their body compiled (graphs run in each iteration):")
            for loop, numbers in self.loops.items():
                runs = ", ".join(f"graph {n} ran {self.graphs[n - 1].calls}x" for n in numbers)
                lines.append(f"  {loop}: {runs}")
        for i, g in enumerate(self.graphs, 1):
            split = f", {g.split}" if g.split else ""
            lines.append(f"Graph {i} ({g.function}{split}): {g.op_count} op(s): {', '.join(g.ops) or '-'}")
        for e in self.entries:
            lines.append(f"Guards of {e.function} ({len(e.guards)}):")
            lines += [f"  {ln}" for ln in e.guards]
        if self.recompile_reasons:
            lines.append("Recompiles:")
            lines += [f"  {r}" for r in self.recompile_reasons]
        return "\n".join(lines)


def graph_report(gm) -> GraphReport:
    """The report of one captured graph (its function is filled in once the caches are walked)."""
    ops = [_op_name(n) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    return GraphReport("", len(ops), ops, gm.code, _split_note(getattr(gm, "meta", {}).get("ember_split")))


def _split_note(info) -> str:
    """'DDP bucket 2 of 3: 4 parameters, 1.2 KB' for a part made by the ddp_buckets pass."""
    if not info:
        return ""
    return (f"DDP bucket {info['index'] + 1} of {info['count']}: {len(info['params'])} parameter(s), "
            f"{info['param_bytes']} bytes (bucket_bytes_cap {info['bucket_bytes_cap']})")


def _op_name(node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    return getattr(t, "__name__", None) or str(t)
