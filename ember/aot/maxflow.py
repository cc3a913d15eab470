"""A small max-flow / min-cut solver (Dinic's algorithm) for the partitioner.

The partitioner needs one s-t min cut per training graph, over a few thousand vertices at most, so a
plain-Python Dinic is fast enough and keeps ember free of a networkx dependency. The search is written
iteratively because joint graphs of deep models form long chains that would overflow Python's recursion
limit.
"""
from __future__ import annotations

from collections import deque

INF = 1e30  # "cannot be cut"; any cut at or above INF_CUT means no finite cut exists
INF_CUT = 1e29


class FlowGraph:
    """A directed graph with edge capacities; vertices are small integers handed out by ``vertex``."""

    def __init__(self) -> None:
        self.names: list[object] = []
        # edges in parallel arrays; edge e and e ^ 1 are a forward edge and its residual twin
        self._to: list[int] = []
        self._cap: list[float] = []
        self._adj: list[list[int]] = []

    def vertex(self, name: object) -> int:
        self.names.append(name)
        self._adj.append([])
        return len(self.names) - 1

    def add_edge(self, u: int, v: int, cap: float) -> None:
        self._adj[u].append(len(self._to))
        self._to.append(v)
        self._cap.append(min(cap, INF))
        self._adj[v].append(len(self._to))
        self._to.append(u)
        self._cap.append(0.0)

    def _levels(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self._adj)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self._adj[u]:
                v = self._to[e]
                if level[v] < 0 and self._cap[e] > 0:
                    level[v] = level[u] + 1
                    queue.append(v)
        return level if level[t] >= 0 else None

    def _blocking_flow(self, s: int, t: int, level: list[int]) -> float:
        """Push flow along shortest augmenting paths until none is left (one Dinic phase)."""
        to, cap, adj = self._to, self._cap, self._adj
        it = [0] * len(adj)  # next edge to try per vertex, so dead ends are never re-scanned
        total = 0.0
        while True:
            path: list[int] = []  # edges from s to the current vertex
            u = s
            while u != t:
                edges = adj[u]
                while it[u] < len(edges):
                    e = edges[it[u]]
                    v = to[e]
                    if cap[e] > 0 and level[v] == level[u] + 1:
                        break
                    it[u] += 1
                if it[u] == len(edges):  # dead end: retreat one edge and skip it next time
                    if not path:
                        return total
                    e = path.pop()
                    u = to[e ^ 1]
                    it[u] += 1
                    continue
                e = edges[it[u]]
                path.append(e)
                u = to[e]
            pushed = min(cap[e] for e in path)
            for e in path:
                cap[e] -= pushed
                cap[e ^ 1] += pushed
            total += pushed
            if pushed >= INF_CUT:
                return total

    def max_flow(self, s: int, t: int) -> float:
        flow = 0.0
        while flow < INF_CUT:
            level = self._levels(s, t)
            if level is None:
                break
            flow += self._blocking_flow(s, t, level)
        return flow

    def source_side(self, s: int) -> set[int]:
        """After ``max_flow``: the vertices still reachable from ``s`` in the residual graph."""
        seen = {s}
        stack = [s]
        while stack:
            u = stack.pop()
            for e in self._adj[u]:
                v = self._to[e]
                if v not in seen and self._cap[e] > 0:
                    seen.add(v)
                    stack.append(v)
        return seen


def min_cut(graph: FlowGraph, s: int, t: int) -> tuple[float, set[int]]:
    """Value of the minimum s-t cut and the source side of one such cut."""
    value = graph.max_flow(s, t)
    return value, graph.source_side(s)
