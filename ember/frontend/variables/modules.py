"""nn.Module instances: parameters and buffers become graph inputs; forward is inlined.

Attribute reads follow nn.Module's own lookup order (parameters, buffers, submodules, instance dict,
class), loading parameters as ``m._parameters['w']`` at run time: the cheap path, skipping
``Module.__getattr__``.
"""
from __future__ import annotations

import itertools
import types

import torch

from ember.frontend import trace_rules
from ember.frontend.errors import Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import AttrSource, ModuleSlotSource
from ember.frontend.variables.base import (
    ConstantVariable, MethodTable, VariableTracker, find_method, guard, guard_id, helpers, register_builder, trackers,
)
from ember.frontend.variables.objects import class_attr_of_instance, lookup_static

_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList,
               torch.nn.ParameterDict)
_DICTS = (torch.nn.ModuleDict, torch.nn.ParameterDict)
_DICT_ONLY = frozenset({"items", "keys", "values", "__contains__"})  # a list-like container has none of these

# Module hooks that torch.export's ``ExportedProgram.module()`` installs and that change nothing a
# graph holds, so ``ember.compile(ep.module())`` can skip them: the input-structure check (the
# compiled entry's guards check the inputs it reads; the ranges are checked by the graph's own
# ``_guards_fn``) and the nn.Module-input toggles, which do nothing when no input is a module.
# Keyed by (module, qualname): the lambdas are made per call, and importing torch.export here
# would slow every ``import ember``.
_EXPORT_HOOKS = {
    ("torch.export._unlift", "_check_input_constraints_pre_hook"),
    ("torch.export._unlift", "_create_stateful_graph_module.<locals>.<lambda>"),
}


def _is_ignorable_hook(fn) -> bool:
    key = (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None))
    if key not in _EXPORT_HOOKS:
        return False
    # the toggles close over the set of nn.Module input types: only an empty set is a no-op
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
    return all(not isinstance(c, (set, frozenset, list, tuple)) or len(c) == 0 for c in cells)


def source_name(source) -> str:
    return source.name() if source is not None else "module"


_CALL_SERIAL = itertools.count()


def _tag_module_call(graph, before, module, source) -> None:
    """Mark the nodes this module call added (those after ``before``) with the call, outermost
    first in ``node.meta["ember_module_calls"]``: the regional pass (ember/backends/regional.py)
    finds repeated blocks by it. The call's nodes are a contiguous run: the graph only grows at its
    end while the call is traced (placeholders, inserted at the front, are skipped)."""
    if before is not None and getattr(before, "_erased", False):
        return  # cannot tell where the call began: leave it unmarked (no regional compile for it)
    # (serial, class name, source, class's module-qualified name: ember.export's nn_module_stack)
    call = (next(_CALL_SERIAL), type(module).__qualname__, source_name(source),
            f"{type(module).__module__}.{type(module).__qualname__}")
    node = before.next if before is not None else next(iter(graph.nodes), None)
    root = getattr(graph, "_root", None)
    while node is not None and node is not root:
        if node.op != "placeholder":
            node.meta.setdefault("ember_module_calls", []).insert(0, call)
        node = node.next


class NNModuleVariable(VariableTracker):
    identity_attr = "module"
    METHODS = MethodTable()  # only for container modules: see call_method

    def __init__(self, module: torch.nn.Module, source, unpinned=None):
        self.module = module
        self.value = module
        self.source = source
        # a module guarded by structure (``_build_module``): the GuardSet that gets its identity
        # guard once the trace depends on which object it is (``is``, a dict key)
        self._unpinned = unpinned
        if unpinned is not None:
            self.identity_attr = "pinned_module"

    @property
    def pinned_module(self) -> torch.nn.Module:
        """The module, for an identity comparison: from here on the entry holds for this object only."""
        if self._unpinned is not None:
            self._unpinned.add(self.source, GuardKind.ID, self.module)
            self._unpinned = None
        return self.module

    def python_type(self):
        return type(self.module)

    def describe(self):
        return f"{type(self.module).__name__} module {self.source.name()}"

    def getattr(self, tx, name):
        # Python's order: a data descriptor of the class, the instance dict, any other class attribute
        # (a method named like a submodule wins), and only then nn.Module.__getattr__'s parameters,
        # buffers and submodules
        m = self.module
        d = m.__dict__
        static, owner = lookup_static(type(m), name)
        if static is not None and hasattr(type(static), "__set__") and not isinstance(static, (types.FunctionType,)):
            return class_attr_of_instance(tx, self, type(m), name, self_source=self.source)
        if name in d:
            return VariableTracker.build(tx, d[name], AttrSource(self.source, name))
        if name == "__class__":
            return VariableTracker.build(tx, type(m), tx.output.object_source(type(m), type(m).__name__))
        if owner is not None:  # (a class attribute may be None)
            return class_attr_of_instance(tx, self, type(m), name, self_source=self.source)
        for slot in ("_parameters", "_buffers", "_modules"):
            if name in d.get(slot, ()):
                return self._slot_item(tx, slot, name)
        raise AttributeError(f"'{type(m).__name__}' object has no attribute '{name}'")

    def _slot_item(self, tx, slot: str, name: str):
        val = self.module.__dict__[slot][name]
        if val is None:
            return ConstantVariable(None)
        return VariableTracker.build(tx, val, ModuleSlotSource(self.source, slot, name))

    def setattr(self, tx, name, value):
        raise Unsupported(f"setting attribute '{name}' of module {self.source.name()} inside forward "
                          "(module state changes are not supported yet)")

    def call(self, tx, args, kwargs):
        m = self.module
        inner = trace_rules.wrapped_module_attr(m)
        if inner is not None:  # a break: the callee runs its forward natively, compiling m.<inner> (cache.py)
            what = f"the module it wraps ({source_name(self.source)}.{inner})" if inner else "its forward"
            exc = Unsupported(f"{type(m).__name__}'s call runs as plain Python (distributed-training machinery); "
                              f"{what} is compiled on its own")
            exc.compile_callee = True
            raise exc
        graph = tx.output.graph
        before = next(iter(reversed(graph.nodes)), None)
        if m._forward_hooks or m._forward_pre_hooks:
            out = self._call_with_hooks(tx, args, kwargs)
        else:
            out = self._call_forward(tx, args, kwargs)
        _tag_module_call(graph, before, m, self.source)
        return out

    def _call_with_hooks(self, tx, args, kwargs):
        """nn.Module.__call__'s hook protocol: pre-hooks may replace the args, hooks the output."""
        m = self.module
        # hooks torch.export's ep.module() adds that change nothing a graph holds (_EXPORT_HOOKS)
        skip = {k for d in (m._forward_pre_hooks, m._forward_hooks) for k, h in d.items()
                if _is_ignorable_hook(h)}
        if any(k not in skip for k in (*m._forward_hooks_with_kwargs, *m._forward_pre_hooks_with_kwargs,
                                        *m._forward_hooks_always_called)) \
                or m._backward_hooks or m._backward_pre_hooks:
            raise Unsupported(f"module hooks with kwargs, always_call or backward hooks on {self.source.name()}")
        pre = VariableTracker.build(tx, m._forward_pre_hooks, AttrSource(self.source, "_forward_pre_hooks"))
        post = VariableTracker.build(tx, m._forward_hooks, AttrSource(self.source, "_forward_hooks"))
        args_vt = trackers.TupleVariable(list(args))
        for key, hook in pre.items.items():
            if key in skip:
                continue
            res = hook.call(tx, [self, args_vt], {})
            if not (res.is_constant() and res.as_constant() is None):
                args_vt = res if isinstance(res, trackers.TupleVariable) else trackers.TupleVariable([res])
        out = self._call_forward(tx, args_vt.items, kwargs)
        for key, hook in post.items.items():
            if key in skip:
                continue
            res = hook.call(tx, [self, args_vt, out], {})
            if not (res.is_constant() and res.as_constant() is None):
                out = res
        return out

    def _call_forward(self, tx, args, kwargs):
        m = self.module
        if "forward" in m.__dict__:
            fwd = m.__dict__["forward"]

            return VariableTracker.build(tx, fwd, AttrSource(self.source, "forward")).call(tx, args, kwargs)
        forward, _ = lookup_static(type(m), "forward")
        if not isinstance(forward, types.FunctionType):
            raise Unsupported(f"{type(m).__name__}.forward is not a Python function")

        return trackers.UserMethodVariable(forward, self).call(tx, args, kwargs)

    # ---- container modules ----------------------------------------------------------------
    def _is_container(self):
        return isinstance(self.module, _CONTAINERS)

    def _children(self, tx):
        m = self.module
        if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict)):
            slot = "_parameters"
        else:
            slot = "_modules"
        if tx.output.module_by_structure(self.source):  # identity no longer implies the children
            guard(tx, AttrSource(self.source, slot), GuardKind.DICT_KEYS, tuple(getattr(m, slot)))
        # read from the slot, not as attributes: a ModuleDict key may be named like a method ("items")
        return [(k, self._slot_item(tx, slot, k)) for k in getattr(m, slot)]

    def unpack(self, tx):
        if not self._is_container():
            return super().unpack(tx) if lookup_static(type(self.module), "__iter__")[0] is None else \
                self.call_method(tx, "__iter__", [], {}).unpack(tx)
        kids = self._children(tx)
        if isinstance(self.module, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return [ConstantVariable(k) for k, _ in kids]
        return [v for _, v in kids]

    def length(self, tx):
        if self._is_container():
            return len(self._children(tx))
        return self.call_method(tx, "__len__", [], {}).as_constant()

    def truth(self, tx):
        if self._is_container():
            return len(self._children(tx)) > 0
        return True

    def call_method(self, tx, name, args, kwargs):
        method = find_method(type(self), name) if self._is_container() else None
        if method is None or (name in _DICT_ONLY and not isinstance(self.module, _DICTS)):
            return self.getattr(tx, name).call(tx, args, kwargs)  # the module's own (Python) method
        return method.fn(self, tx, args, kwargs)

    # -- the container modules' methods (Sequential, ModuleList, ModuleDict, Parameter*) --
    @METHODS("__getitem__")
    def _getitem(self, tx, args, kwargs):
        key = args[0].as_constant()
        kids = self._children(tx)
        if isinstance(key, str):
            return dict(kids)[key]
        if isinstance(key, slice):
            if isinstance(self.module, torch.nn.Sequential):
                return ModuleSliceVariable([v for _, v in kids][key])
            return trackers.TupleVariable([v for _, v in kids][key])
        return kids[key][1]

    @METHODS("__len__")
    def _len(self, tx, args, kwargs):
        return ConstantVariable(self.length(tx))

    @METHODS("__iter__")
    def _iter(self, tx, args, kwargs):
        return trackers.ListIteratorVariable(self.unpack(tx))

    @METHODS("items")
    def _items(self, tx, args, kwargs):
        return trackers.DictViewVariable(trackers.DictVariable(dict(self._children(tx))), "items")

    @METHODS("keys")
    def _keys(self, tx, args, kwargs):
        return trackers.DictViewVariable(trackers.DictVariable(dict(self._children(tx))), "keys")

    @METHODS("values")
    def _values(self, tx, args, kwargs):
        return trackers.DictViewVariable(trackers.DictVariable(dict(self._children(tx))), "values")

    @METHODS("__contains__")
    def _contains(self, tx, args, kwargs):
        return ConstantVariable(args[0].as_constant() in dict(self._children(tx)))


class NewModuleVariable(NNModuleVariable):
    """A torch.nn module without state made by the traced code (``nn.Softmax(dim=-1)(x)``): built
    while tracing from its constant arguments; if it escapes, the entry builds a fresh one alike."""

    def __init__(self, module, source, args: list, kwargs: dict):
        super().__init__(module, source)
        self.args = args
        self.kwargs = kwargs

    def reconstruct(self, cg):
        args = "".join(f"{cg.reconstruct(a)}, " for a in self.args)
        kw = "".join(f"{k}={cg.reconstruct(v)}, " for k, v in self.kwargs.items())
        cls = type(self.module)
        return cg.memo(self, lambda: f"{cg.const(cls, cls.__name__)}({args}{kw})")


@helpers.add
def create_module(tx, cls: type, args: list, kwargs: dict) -> NewModuleVariable | None:
    """``torch.nn.<Module>(...)`` called by the traced code. torch's own modules build deterministically
    from their arguments; one with parameters or buffers would draw initial values, which the graph
    would have to redo on every call, so only stateless ones are made here. None for other classes
    (their ``__init__`` is traced like any class's)."""
    if not cls.__module__.startswith("torch.nn.modules."):
        return None
    if not all(v.is_constant() for v in [*args, *kwargs.values()]):
        raise Unsupported(f"creating {cls.__qualname__} from non-constant arguments inside the compiled function")
    with torch.random.fork_rng(devices=[]):  # a constructor that draws initial values must not move the RNG
        module = cls(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise Unsupported(f"creating {cls.__qualname__} (it has parameters or buffers) inside the compiled function")
    return NewModuleVariable(module, tx.output.object_source(module, cls.__name__), list(args), dict(kwargs))


class ModuleSliceVariable(VariableTracker):
    """``seq[a:b]`` of an nn.Sequential: calling it runs the modules in order."""

    def __init__(self, mods):
        self.mods = mods

    def unpack(self, tx):
        return list(self.mods)

    def call(self, tx, args, kwargs):
        (x,) = args
        for m in self.mods:
            x = m.call(tx, [x], {})
        return x


@register_builder(torch.nn.Module, kind="object")
def _build_module(tx, value, source):
    if source is None:
        raise Unsupported(f"an nn.Module ({type(value).__name__}) created inside the compiled function")
    by_structure = tx.output.module_by_structure(source)
    if by_structure:
        # one of many identical blocks (a loop variable over a ModuleList, the self of a forward
        # that identical FSDP2 blocks share): every value the trace reads from it is guarded where
        # it is read (parameters are graph inputs, ints and floats constants, submodules likewise),
        # so what remains is what identity implied: the class (forward and the class attributes)
        # and which names the instance dict holds (none shadowing a class attribute, no instance
        # forward). Identity itself is guarded only if the trace compares it (``pinned_module``).
        guard(tx, source, GuardKind.TYPE, type(value))
        guard(tx, AttrSource(source, "__dict__"), GuardKind.DICT_KEYS, tuple(value.__dict__))
    else:
        guard_id(tx, value, source)
    if not (value._forward_hooks or value._forward_pre_hooks):
        guard(tx, source, GuardKind.NO_HOOKS)  # else the call guards the hook dicts
    return NNModuleVariable(value, source, tx.output.guards if by_structure else None)
