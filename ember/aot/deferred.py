"""Graph modules from the autograd layer's cache whose nodes are built only when something reads them.

A warm process whose compiled graphs come from the native backend's cache never looks at most of a
traced graph: the backend hashes its code (stored), its constants (stored) and its inputs'
descriptions, then imports the wrapper. Rebuilding every node and a FakeTensor for every value was
most of the autograd layer's warm load (GPT-2 training on CPU: 5,430 FakeTensors and 5,372 nodes,
0.63 of its 0.97 s under cProfile, ``benchmarks/warm_profile.py``). So a cached graph is stored as a
*summary* (its code, constants, module metadata, its placeholders' values, the device types its
values live on) plus its nodes pickled apart, as bytes; loading builds a ``DeferredGraphModule`` from
the summary alone. The first read of ``.graph`` (a pass, a lowering after a native-cache miss, a
dump, running its Python code as the fallback) unpickles the nodes and checks they generate the
stored code.

The questions the warm path asks answer from the summary without building the graph:
``placeholder_vals``, ``value_device_types``, ``get_attr_targets``, and what default mode's automatic
CUDA-graph decision reads (``summary["auto"]``: ``cudagraphs.auto.graph_facts``, taken at store). Code
that asks them of any graph module gets the same answers a built graph would give.

The check that the nodes rebuild to the stored code moves from load to the first read. The entry's key
hashes torch's version and ember's sources (``cache.key_of``) and ``ember.diskcache`` checks the bytes'
SHA-256, so a difference there means the entry is not what its key says: that read raises
``StaleCacheEntry`` naming the entry and the fix (the caller sees an error, never a wrong graph).
"""
from __future__ import annotations

import threading

import torch
import torch.fx as fx

_LOCK = threading.RLock()  # one materialization per module, also when threads read it at once
STATS = {"deferred": 0, "materialized": 0}


class StaleCacheEntry(Exception):  # (not a RuntimeError: no caller mistakes it for a failed build)
    """A deferred graph whose stored nodes do not generate its stored code."""


def _loaded_base():
    from ember.aot.cache import LoadedGraphModule
    return LoadedGraphModule


def summary_of(gm: fx.GraphModule, nodes_blob: bytes) -> dict:
    """What ``DeferredGraphModule`` needs of ``gm`` without its nodes (``nodes_blob``: its nodes and
    codegen, pickled by ``cache._Pickler``)."""
    from ember.aot.cache import _attr
    placeholders, devices, attrs, targets = [], set(), {}, []
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder":
            placeholders.append(v)
        elif n.op == "get_attr":
            attrs[n.target] = _attr(gm, n.target)
            targets.append(n.target)
        if isinstance(v, torch.Tensor):
            devices.add(v.device.type)
    return dict(code=gm.code, attrs=attrs, attr_targets=targets, meta=dict(gm.meta), name=getattr(gm, "_ember_name", None),
                placeholders=placeholders, devices=sorted(devices), nodes=nodes_blob, auto=_auto_facts(gm))


def _auto_facts(gm: fx.GraphModule):
    """What default mode's automatic CUDA-graph decision reads of the graph (``cudagraphs.auto.graph_facts``),
    or None (then a warm decision reads the graph, building it). Without them, deciding whether a
    loaded training graph replays built its nodes: 0.57 s of GPT-2 training's 1.17 s warm first call
    on the H100."""
    try:
        from ember.cudagraphs.auto import graph_facts
        return graph_facts(gm)
    except Exception:  # noqa: BLE001 - a value a FLOP formula or a size cannot read: decided from the graph
        return None


class DeferredGraphModule:
    """Mixin of ``cache.LoadedGraphModule`` (see ``_class``): ``_graph`` is built on first read."""

    @property
    def _graph(self):
        g = self.__dict__.get("_graph")
        return g if g is not None else self._ember_materialize()

    @_graph.setter
    def _graph(self, g):
        self.__dict__["_graph"] = g

    def _ember_materialize(self) -> fx.Graph:
        with _LOCK:
            g = self.__dict__.get("_graph")
            if g is not None:
                return g
            from ember.aot.cache import rebuild_nodes
            summary, fake_mode = self.__dict__["_ember_deferred"]
            try:
                g = rebuild_nodes(summary, fake_mode)
                same = g.python_code(root_module="self").src == summary["code"]
            except Exception as e:  # noqa: BLE001 - an entry that passed its checksum but does not load
                raise StaleCacheEntry(_stale(summary, f"its nodes do not load ({type(e).__name__}: {e})")) from e
            if not same:
                raise StaleCacheEntry(_stale(summary, "its nodes do not generate its stored code"))
            self.__dict__["_graph"] = g
            g.owning_module = self
            del self.__dict__["_ember_deferred"]
            STATS["materialized"] += 1
            return g

    def __deepcopy__(self, memo):
        self._graph  # noqa: B018 - built first: a copy holds a real graph
        return super().__deepcopy__(memo)

    def __reduce__(self):
        self._graph  # noqa: B018
        return super().__reduce__()


def _stale(summary: dict, why: str) -> str:
    from ember.config import config
    return (f"ember aot cache: the cached graph {summary.get('name') or ''} cannot be rebuilt: {why}. The entry "
            f"does not match its key (a cache written by another build under the same versions?); delete "
            f"{config.cache_dir}/aot or run with EMBER_AOT_CACHE=0, and the graph is traced again")


_CLASS = []


def _class():
    if not _CLASS:
        _CLASS.append(type("DeferredGraphModule", (DeferredGraphModule, _loaded_base()), {}))
    return _CLASS[0]


def load(summary: dict, fake_mode) -> fx.GraphModule:
    """A graph module of a stored summary: attributes, code and metadata now, nodes on first read."""
    stub = fx.Graph()  # get_attr nodes only: GraphModule's constructor copies those attributes
    for target in summary["attrs"]:
        stub.get_attr(target)
    gm = _class()(summary["attrs"], stub)
    gm.__dict__["_graph"] = None
    gm.__dict__["_ember_deferred"] = (summary, fake_mode)
    type(gm)._ember_code = summary["code"]
    gm.meta.update(summary["meta"])
    if summary["name"] is not None:
        gm._ember_name = summary["name"]
    STATS["deferred"] += 1
    return gm


def pending(gm):
    """(summary, fake mode) of a graph module whose nodes are not built yet, else None; ``load(*it)``
    makes another module of the same stored graph."""
    return gm.__dict__.get("_ember_deferred")


def _summary(gm):
    d = pending(gm)
    return d[0] if d is not None else None


def is_deferred(gm) -> bool:
    """Are ``gm``'s nodes still unbuilt?"""
    return _summary(gm) is not None


def placeholder_vals(gm) -> list:
    """Each placeholder's ``meta['val']`` (None where it has none), in order."""
    s = _summary(gm)
    if s is not None:
        return list(s["placeholders"])
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def value_device_types(gm) -> set:
    """The device types ('cpu', 'cuda', ...) of the graph's tensor values (``meta['val']``)."""
    s = _summary(gm)
    if s is not None:
        return set(s["devices"])
    return {v.device.type for v in (n.meta.get("val") for n in gm.graph.nodes) if isinstance(v, torch.Tensor)}


def get_attr_targets(gm) -> list:
    """The targets of the graph's ``get_attr`` nodes, in node order."""
    s = _summary(gm)
    if s is not None:
        return list(s["attr_targets"])
    return [n.target for n in gm.graph.nodes if n.op == "get_attr"]
