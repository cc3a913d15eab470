"""Python-visible effects of a trace, replayed after the graph runs.

While tracing, a write to an attribute of an object that exists outside the compiled function is
recorded here (and later reads in the same trace see the new value); the entry function replays the
final values, in the order of the first write, after calling the graph.
"""
from __future__ import annotations

from ember.frontend.variables.base import VariableTracker
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.sets import SetVariable

_DELETED = object()


class SideEffects:
    def __init__(self) -> None:
        # (id(obj), name) -> (owner tracker, name, value tracker)
        self._attr_writes: dict = {}
        # containers from outside the function that the trace mutated, by id of their tracker
        self._containers: dict = {}
        # assignable places outside the frame (module globals, closure cells): source -> value tracker
        self._stores: dict = {}

    def track_container(self, vt) -> None:
        self._containers.setdefault(id(vt), vt)

    def store_attr(self, owner: VariableTracker, obj, name: str, value: VariableTracker) -> None:
        # dict order is the first write's position; the value is the last write's
        self._attr_writes[(id(obj), name)] = (owner, name, value)

    def load_attr(self, obj, name: str):
        hit = self._attr_writes.get((id(obj), name))
        return None if hit is None else hit[2]

    def written_attrs(self, obj) -> dict:
        """name -> value tracker of every attribute of ``obj`` this trace wrote."""
        return {name: value for (oid, name), (_, _, value) in self._attr_writes.items() if oid == id(obj)}

    def store_source(self, source, value: VariableTracker) -> None:
        """``global g; g = v`` or ``nonlocal c; c = v``: later loads in the trace see ``value``."""
        self._stores[source] = value

    def load_source(self, source):
        return self._stores.get(source)

    def __bool__(self) -> bool:
        return bool(self._attr_writes or self._containers or self._stores)

    def codegen(self, cg) -> list[str]:
        lines = []
        for vt in self._containers.values():
            target = cg.load(vt.source)
            if isinstance(vt, DictVariable):
                lines.append(f"{target}.clear(); {target}.update({vt.items_literal(cg)})  # replayed dict mutation")
            elif isinstance(vt, SetVariable):
                lines.append(f"{target}.clear(); {target}.update({vt.items_literal(cg)})  # replayed set mutation")
            else:
                items = ", ".join(cg.reconstruct(i) for i in vt.items)
                lines.append(f"{target}[:] = [{items}]  # replayed list mutation")
        for source, value in self._stores.items():
            parent = source.base()
            target = source.render(cg.load(parent)) if parent is not None else source.expr()
            lines.append(f"{target} = {cg.reconstruct(value)}  # replayed {source.name()} assignment")
        for owner, name, value in self._attr_writes.values():
            target = cg.load(owner.source)
            expr = cg.reconstruct(value)
            if name.isidentifier():
                lines.append(f"{target}.{name} = {expr}  # replayed attribute write")
            else:
                lines.append(f"setattr({target}, {name!r}, {expr})  # replayed attribute write")
        return lines
