"""``ember.explain(fn)(*args, **kwargs)``: run ``fn`` once through ember and report what happened —
the graphs, each graph break with its reason and the user's file:line, ops per graph, the guards of
each cache entry, and recompile reasons. ``print(report)`` is meant to be read by people.
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
    out: Any = None

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

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
        for i, g in enumerate(self.graphs, 1):
            lines.append(f"Graph {i} ({g.function}): {g.op_count} op(s): {', '.join(g.ops) or '-'}")
        for e in self.entries:
            lines.append(f"Guards of {e.function} ({len(e.guards)}):")
            lines += [f"  {ln}" for ln in e.guards]
        if self.recompile_reasons:
            lines.append("Recompiles:")
            lines += [f"  {r}" for r in self.recompile_reasons]
        return "\n".join(lines)


def _op_name(node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    return getattr(t, "__name__", None) or str(t)


def explain(fn, *, backend="eager"):
    """``explain(fn)(*args, **kwargs)`` compiles and runs ``fn`` once and returns an ExplainReport."""
    import ember
    from ember.frontend.cache import FrameCache

    def run(*args, **kwargs) -> ExplainReport:
        report = ExplainReport()
        graph_ids: list = []
        owner: dict = {}
        inner = ember.api.make_compiler(backend, None, {})

        def recording(gm, example_inputs):
            ops = [_op_name(n) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
            report.graphs.append(GraphReport("", len(ops), ops, gm.code))
            graph_ids.append(id(gm))
            return inner(gm, example_inputs)

        compiled = ember.compile(fn, backend=recording)
        report.out = compiled(*args, **kwargs)
        seen: set = set()

        def visit(cache: FrameCache) -> None:
            if id(cache) in seen:
                return
            seen.add(id(cache))
            if cache.fallback_reason is not None:
                report.fallbacks.append((cache.root.name, cache.fallback_reason))
            report.recompile_reasons += [f"{cache.root.name}: {r}" for r in cache.recompile_reasons]
            for entry in reversed(cache.entries):
                guards = [f"{g.source.name() if g.source is not None else 'global state'}: {g.kind.name}"
                          for g in entry.guards]
                report.entries.append(EntryReport(cache.root.name, guards, list(entry.breaks)))
                if entry.graph is not None:
                    owner[id(entry.graph)] = cache.root.name
            for sub in cache.break_context.caches():
                visit(sub)

        visit(compiled._ember_cache)
        for g, gid in zip(report.graphs, graph_ids):
            g.function = owner.get(gid, "?")
        return report

    return run
