"""The graph under construction: FX graph, graph inputs, fake-tensor propagation, guards.

Every tensor operation the interpreter meets goes through ``OutputGraph.call``: it adds one FX node
and runs the same operation on FakeTensors to learn the result's metadata, so capture never computes
on real data and never touches real tensors.
"""
from __future__ import annotations

import operator
import re
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree

from ember.frontend.errors import Unsupported
from ember.frontend.guards import GuardKind, GuardSet, TensorMeta, global_state
from ember.frontend.sources import Source

# Torch calls that change process state: running them on fake tensors at trace time would leak the
# effect into the real program, so they are refused (a graph break once breaks exist).
_STATEFUL_TORCH = {
    "manual_seed", "seed", "initial_seed", "set_rng_state", "get_rng_state", "set_default_dtype",
    "set_default_device", "set_default_tensor_type", "use_deterministic_algorithms", "set_printoptions",
    "set_num_threads", "set_num_interop_threads", "save", "load", "synchronize", "set_flush_denormal",
}
# Tensor methods whose result depends on tensor *data* (or leaves the graph's world).
_DATA_DEPENDENT_METHODS = {
    "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "data_ptr",
    "backward", "register_hook", "retain_grad", "untyped_storage", "storage", "cpu_numpy",
}


def _sanitize(name: str) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", name).strip("_")
    if not name or name[0].isdigit():
        name = "v_" + name
    return name


class OutputGraph:
    def __init__(self, root_globals: dict | None = None) -> None:
        self.root_globals = root_globals
        self.graph = fx.Graph()
        self.fake_mode = FakeTensorMode(static_shapes=True)
        self.guards = GuardSet()
        self.guards.add(None, GuardKind.GLOBAL_STATE, global_state())
        # graph inputs, in placeholder order: (source, real value, placeholder node)
        self.inputs: list[tuple[Source, Any, fx.Node]] = []
        self._input_vt_by_id: dict[int, Any] = {}
        self._placeholder_names: set[str] = set()
        # objects the generated entry function refers to by name (globals dicts, the root callable...)
        self.namespace: dict[str, Any] = {}
        self._ns_by_id: dict[int, str] = {}
        # one tracker per source, so a value read twice is the same tracker (and guarded once)
        self.wrap_cache: dict = {}
        from ember.frontend.side_effects import SideEffects

        self.side_effects = SideEffects()

    # ---- the entry namespace ----------------------------------------------------------------
    def globals_ns(self, g: dict) -> str:
        name = self._ns_by_id.get(id(g))
        if name is None:
            name = "__g" if g is self.root_globals else f"__g{len(self.namespace)}"
            self.namespace[name] = g
            self._ns_by_id[id(g)] = name
        return name

    def object_source(self, obj, label: str):
        """A source for an object reached without a runtime path: the entry holds it by name."""
        from ember.frontend.sources import ConstSource

        name = self._ns_by_id.get(id(obj))
        if name is None:
            name = f"__obj{len(self.namespace)}_{_sanitize(label)[:30]}"
            self.namespace[name] = obj
            self._ns_by_id[id(obj)] = name
        return ConstSource(name, label)

    # ---- inputs ----------------------------------------------------------------------------
    def add_tensor_input(self, value: torch.Tensor, source: Source):
        """Wrap a real tensor reached through ``source`` as a graph input (one placeholder per object)."""
        from ember.frontend.variables.tensor import TensorVariable

        existing = self._input_vt_by_id.get(id(value))
        if existing is not None:
            if existing.source != source:
                self.guards.add(source, GuardKind.ALIAS, None, other=existing.source)
            return existing
        self.guards.add(source, GuardKind.TENSOR, TensorMeta.of(value))
        name = _sanitize(source.name())
        base, k = name, 1
        while name in self._placeholder_names:
            name = f"{base}_{k}"
            k += 1
        self._placeholder_names.add(name)
        # placeholders must precede every other node
        if self.inputs:
            with self.graph.inserting_after(self.inputs[-1][2]):
                node = self.graph.placeholder(name)
        else:
            first = next(iter(self.graph.nodes), None)
            if first is None:
                node = self.graph.placeholder(name)
            else:
                with self.graph.inserting_before(first):
                    node = self.graph.placeholder(name)
        fake = self.fake_mode.from_tensor(value, static_shapes=True)
        node.meta["example_value"] = fake
        node.meta["source"] = source.name()
        self.inputs.append((source, value, node))
        vt = TensorVariable(node, fake, source=source)
        self._input_vt_by_id[id(value)] = vt
        return vt

    # ---- operations ------------------------------------------------------------------------
    def call(self, tx, kind: str, target, args: list, kwargs: dict):
        """Add ``target(*args, **kwargs)`` to the graph (kind: call_function or call_method)."""
        if kind == "call_method" and target in _DATA_DEPENDENT_METHODS:
            raise Unsupported(
                f"Tensor.{target}() needs the tensor's data, which is unknown while tracing",
                hint="keep the value as a tensor, or move this out of the compiled function")
        if kind == "call_function" and getattr(target, "__name__", None) in _STATEFUL_TORCH and \
                str(getattr(target, "__module__", "")).startswith("torch"):
            raise Unsupported(f"torch.{target.__name__}() changes global state, which a graph cannot hold")
        node_args = pytree.tree_map(lambda v: _to_node_arg(v), (args, kwargs), is_leaf=_is_vt)
        fake_args = pytree.tree_map(lambda v: _to_fake_arg(v), (args, kwargs), is_leaf=_is_vt)
        node = self.graph.create_node(kind, target, tuple(node_args[0]), node_args[1])
        node.meta["stack_trace"] = tx.user_location() if tx is not None else ""
        try:
            with self.fake_mode:
                if kind == "call_method":
                    self_arg, *rest = fake_args[0]
                    result = getattr(self_arg, target)(*rest, **fake_args[1])
                else:
                    result = target(*fake_args[0], **fake_args[1])
        except Unsupported:
            self.graph.erase_node(node)
            raise
        except Exception as exc:
            self.graph.erase_node(node)
            raise _fake_error(kind, target, exc) from exc
        if isinstance(result, FakeTensor):
            for vt in pytree.tree_leaves((args, kwargs), is_leaf=_is_vt):
                if getattr(vt, "fake", None) is result:
                    # in-place ops (x.add_(), x += y, out=...) and no-op conversions return the same
                    # object: keep the identity (`y is x`) by returning the same tracker
                    node.meta["example_value"] = result
                    node.meta["ember_returns_input"] = True  # an effect on an input: never dead code
                    return vt
        return self.wrap_result(node, result, mutating=_is_mutating(kind, target))

    def wrap_result(self, node: fx.Node, result, mutating: bool = False):
        from ember.frontend.variables.builder import wrap_const
        from ember.frontend.variables.containers import StructSeqVariable, TupleVariable, ListVariable
        from ember.frontend.variables.tensor import TensorVariable

        if isinstance(result, FakeTensor):
            node.meta["example_value"] = result
            return TensorVariable(node, result)
        if isinstance(result, (tuple, list)) and any(isinstance(r, torch.Tensor) for r in pytree.tree_leaves(result)):
            node.meta["example_value"] = result
            items = []
            for i, r in enumerate(result):
                item = self.graph.call_function(operator.getitem, (node, i))
                items.append(self.wrap_result(item, r))
            if isinstance(result, list):
                return ListVariable(items)
            if type(result) is not tuple and hasattr(type(result), "n_fields"):
                return StructSeqVariable(type(result), items)
            return TupleVariable(items)
        if isinstance(result, torch.Tensor):
            raise Unsupported(f"an operation returned a real tensor while tracing ({node.target})")
        if not mutating and not node.users:
            self.graph.erase_node(node)
        return wrap_const(result)

    def op_nodes(self) -> int:
        return sum(1 for n in self.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def _is_vt(x) -> bool:
    from ember.frontend.variables.base import VariableTracker

    return isinstance(x, VariableTracker)


def _is_mutating(kind: str, target) -> bool:
    if target is operator.setitem:
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def _to_node_arg(v):
    from ember.frontend.variables.base import VariableTracker

    if isinstance(v, VariableTracker):
        return v.as_node_arg()
    return v


def _to_fake_arg(v):
    from ember.frontend.variables.base import VariableTracker

    if isinstance(v, VariableTracker):
        return v.as_fake_arg()
    return v


def _fake_error(kind, target, exc: Exception) -> Unsupported:
    name = target if isinstance(target, str) else getattr(target, "__qualname__", repr(target))
    what = f"Tensor.{name}" if kind == "call_method" else name
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    cls = type(exc).__name__
    if "DataDependent" in cls or "DynamicOutputShape" in cls:
        return Unsupported(f"{what} depends on tensor data or has a data-dependent output shape ({cls})",
                           hint="keep the result as a tensor, or move this out of the compiled function")
    err = Unsupported(f"{what} failed while tracing with fake tensors: {cls}: {text}")
    err.user_error = exc  # the same call would fail eagerly too
    return err
