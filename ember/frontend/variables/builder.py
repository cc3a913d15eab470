"""The one factory of variable trackers.

``wrap(tx, value, source)`` turns a real object reached through ``source`` into a tracker and records
the guard that makes the trace valid for it. ``wrap_const(value)`` does the same for values made
while tracing (no source, no guard).
"""
from __future__ import annotations

import builtins
import enum
import functools
import math
import operator
import types

import torch

from ember.frontend import trace_rules
from ember.frontend.errors import Unsupported
from ember.frontend.dynamic import is_argument_source
from ember.frontend.guards import GuardKind
from ember.frontend.sources import AttrSource, ItemSource, Source
from ember.frontend.variables.base import ConstantVariable, VariableTracker

_CONST_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), type(NotImplemented),
                torch.dtype, torch.device, torch.layout, torch.memory_format, range, types.CodeType)


def is_namedtuple_cls(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields") and hasattr(cls, "_make")


def wrap_const(value) -> VariableTracker:
    """A tracker for a value made while tracing (e.g. a constant-folded result)."""
    from ember.frontend.variables import containers as C

    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        # a symbolic value reached with no graph node for it: specialize (guarded, never wrong)
        return ConstantVariable({torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)](value))
    if isinstance(value, torch.Size) and not all(type(v) is int for v in value):
        return ConstantVariable(torch.Size(int(v) for v in value))
    if isinstance(value, _CONST_TYPES) or isinstance(value, torch.Size):
        return ConstantVariable(value)
    if type(value) is tuple:
        if all(isinstance(v, _CONST_TYPES) for v in value):
            return ConstantVariable(value)
        return C.TupleVariable([wrap_const(v) for v in value])
    if type(value) is list:
        return C.ListVariable([wrap_const(v) for v in value])
    if type(value) is dict:
        return C.DictVariable({k: wrap_const(v) for k, v in value.items()})
    if isinstance(value, (set, frozenset)):
        return C.SetVariable.of_real(value, [wrap_const(v) for v in value])
    if type(value) is slice:
        return ConstantVariable(value)
    if is_namedtuple_cls(type(value)):
        return C.NamedTupleVariable(type(value), [wrap_const(v) for v in value])
    if isinstance(value, enum.Enum):
        return ConstantVariable(value)
    return _wrap_object(None, value, None)


def wrap(tx, value, source: Source) -> VariableTracker:
    """A tracker for a real value reached through ``source``, guarded (once per source)."""
    cache = tx.output.wrap_cache
    hit = cache.get(source)
    if hit is not None and hit[0] is value:
        return hit[1]
    vt = _wrap(tx, value, source)
    cache[source] = (value, vt)
    return vt


def _wrap(tx, value, source: Source) -> VariableTracker:
    from ember.frontend.variables import containers as C

    guards = tx.output.guards
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise Unsupported(f"tensor subclass {type(value).__name__} at {source.name()}")
        return tx.output.add_tensor_input(value, source)
    if value is None or isinstance(value, bool):
        guards.add(source, GuardKind.CONST, value)
        return ConstantVariable(value, source)
    if type(value) is int and is_argument_source(source) and tx.output.shapes.int_dynamic(source.name(), value):
        vt = tx.output.add_symint_input(value, source)
        if vt is not None:
            return vt
    if type(value) in (int, float, str, bytes, complex):
        guards.add(source, GuardKind.CONST, value)
        return ConstantVariable(value, source)
    if isinstance(value, torch.device):
        guards.add(source, GuardKind.CONST, value)
        return ConstantVariable(value, source)
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format, type(Ellipsis), enum.Enum)):
        guards.add(source, GuardKind.ID, value)
        return ConstantVariable(value, source)
    if isinstance(value, torch.Size):
        guards.add(source, GuardKind.TYPE, torch.Size)
        guards.add(source, GuardKind.LEN, len(value))
        for i, v in enumerate(value):
            guards.add(ItemSource(source, i), GuardKind.CONST, v)
        return ConstantVariable(value, source)
    if type(value) in (tuple, list) or is_namedtuple_cls(type(value)):
        guards.add(source, GuardKind.TYPE, type(value))
        guards.add(source, GuardKind.LEN, len(value))
        items = [wrap(tx, v, ItemSource(source, i)) for i, v in enumerate(value)]
        if type(value) is list:
            return C.ListVariable(items, source)
        if type(value) is tuple:
            return C.TupleVariable(items, source)
        attrs = {}
        if hasattr(value, "__dict__"):  # a subclass carrying instance attributes
            dsrc = AttrSource(source, "__dict__")
            guards.add(dsrc, GuardKind.DICT_KEYS, tuple(vars(value)))
            attrs = {k: wrap(tx, v, ItemSource(dsrc, k)) for k, v in vars(value).items()}
        return C.NamedTupleVariable(type(value), items, source, attrs=attrs)
    if type(value) is dict or (isinstance(value, dict) and type(value).__module__ == "collections"):
        guards.add(source, GuardKind.TYPE, type(value))
        keys = list(value.keys())
        if not all(isinstance(k, (int, str, float, bool, type(None), enum.Enum, tuple)) or _is_identity_key(k)
                   for k in keys):
            raise Unsupported(f"dict with non-constant keys at {source.name()}")
        guards.add(source, GuardKind.DICT_KEYS, tuple(keys))
        items = {k: wrap(tx, value[k], ItemSource(source, k)) for k in keys}
        key_vts = {k: _wrap_object(tx, k, None) for k in keys if _is_identity_key(k)}
        factory = getattr(value, "default_factory", None)  # a defaultdict's: a missing key calls it
        factory = wrap(tx, factory, AttrSource(source, "default_factory")) if factory is not None else None
        return C.DictVariable(items, source, py_type=type(value), key_vts=key_vts, default_factory=factory)
    if type(value) in (set, frozenset):
        if not all(isinstance(v, _CONST_TYPES) for v in value):
            raise Unsupported(f"set of non-constants at {source.name()}")
        guards.add(source, GuardKind.CONST, type(value)(value))
        return C.SetVariable.of_real(value, [ConstantVariable(v) for v in value],
                                     source=source if type(value) is set else None)
    if type(value) is slice:
        guards.add(source, GuardKind.CONST, value)
        return ConstantVariable(value, source)
    return _wrap_object(tx, value, source)


def _is_identity_key(k) -> bool:
    """A dict key that hashes and compares by identity and is fixed once the dict's keys are guarded:
    classes, functions, typing's special forms (e.g. a table of validators keyed by type)."""
    return isinstance(k, (type, types.FunctionType, types.BuiltinFunctionType)) or type(k).__module__ == "typing"


def _wrap_object(tx, value, source):
    """Functions, classes, modules, and user objects."""
    from ember.frontend.builtins import HANDLERS as BUILTIN_HANDLERS
    from ember.frontend.variables import functions as F
    from ember.frontend.variables import model_outputs as MO
    from ember.frontend.variables import modules as M
    from ember.frontend.variables import objects as O

    # a bound method of a builtin (``lst.append``, ``dict.fromkeys``) is made afresh on every attribute
    # read: an identity guard on it would never hold again; its owner's guards pin it down instead
    bound_to = getattr(value, "__self__", None) if isinstance(value, (types.BuiltinMethodType, types.MethodWrapperType)) else None
    fresh = bound_to is not None and not isinstance(bound_to, types.ModuleType)

    def guard(kind, expected=None):
        if source is not None and not (fresh and kind is GuardKind.ID):
            tx.output.guards.add(source, kind, expected)

    user_rule = _user_rule(value, source)  # ember.disable / substitute_in_graph / allow_in_graph ...
    if user_rule is not None:
        guard(GuardKind.ID, value)
        return user_rule
    python_fn = trace_rules.python_behind(value)
    if python_fn is not None:
        guard(GuardKind.ID, value)
        return F.UserFunctionVariable(python_fn)
    try:
        is_builtin_handled = value in BUILTIN_HANDLERS
        special = trace_rules.special_callable(value)
    except TypeError:  # unhashable
        is_builtin_handled, special = False, None
    if is_builtin_handled:
        guard(GuardKind.ID, value)
        return F.BuiltinVariable(value, source)
    if special is not None:
        guard(GuardKind.ID, value)
        return special(value, source)
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        guard(GuardKind.ID, value)  # an operator called directly (torch.ops.aten.add.Tensor): a graph op
        return F.TorchFunctionVariable(value, source)
    if isinstance(value, torch.nn.Module):
        if source is None:
            raise Unsupported(f"an nn.Module ({type(value).__name__}) created inside the compiled function")
        guard(GuardKind.ID, value)
        if not (value._forward_hooks or value._forward_pre_hooks):
            tx.output.guards.add(source, GuardKind.NO_HOOKS)  # else the call guards the hook dicts
        return M.NNModuleVariable(value, source)
    if isinstance(value, types.ModuleType):
        guard(GuardKind.ID, value)
        return O.PythonModuleVariable(value, source)
    if isinstance(value, types.FunctionType):
        guard(GuardKind.ID, value)
        if trace_rules.is_torch_callable(value):
            return F.TorchFunctionVariable(value, source)
        return F.UserFunctionVariable(value, source)
    if isinstance(value, types.MethodType):
        func = value.__func__
        if source is not None:
            tx.output.guards.add(AttrSource(source, "__func__"), GuardKind.ID, func)
            self_vt = wrap(tx, value.__self__, AttrSource(source, "__self__"))
        else:
            self_vt = wrap_const(value.__self__)
        if trace_rules.is_torch_callable(func):
            return F.TorchFunctionVariable(value, source)
        return F.UserMethodVariable(func, self_vt)
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                          types.WrapperDescriptorType, types.MethodDescriptorType, types.ClassMethodDescriptorType)):
        guard(GuardKind.ID, value)
        if trace_rules.is_torch_callable(value):
            return F.TorchFunctionVariable(value, source)
        self_obj = getattr(value, "__self__", None)
        if self_obj is not None and not isinstance(self_obj, types.ModuleType):
            if isinstance(self_obj, _CONST_TYPES) or isinstance(self_obj, (tuple, frozenset)):
                return F.ConstantMethodVariable(self_obj, value.__name__)
        name = getattr(value, "__name__", "")
        if getattr(builtins, name, None) is value or getattr(math, name, None) is value \
                or getattr(operator, name, None) is value:
            return F.BuiltinVariable(value, source)
        return F.OpaqueCallableVariable(value, source)
    if isinstance(value, functools._lru_cache_wrapper):
        guard(GuardKind.ID, value)
        return F.LruCacheVariable(value, source)
    if isinstance(value, functools.partial):
        guard(GuardKind.TYPE, functools.partial)
        if source is not None:
            fn = wrap(tx, value.func, AttrSource(source, "func"))
            args = [wrap(tx, a, ItemSource(AttrSource(source, "args"), i)) for i, a in enumerate(value.args)]
            kw = {k: wrap(tx, v, ItemSource(AttrSource(source, "keywords"), k)) for k, v in value.keywords.items()}
        else:
            fn = wrap_const(value.func)
            args = [wrap_const(a) for a in value.args]
            kw = {k: wrap_const(v) for k, v in value.keywords.items()}
        return F.PartialVariable(fn, args, kw)
    if isinstance(value, type):
        guard(GuardKind.ID, value)
        return O.UserClassVariable(value, source)
    if isinstance(value, (staticmethod, classmethod)):
        return _wrap_object(tx, value.__func__, source)
    if isinstance(value, (torch.finfo, torch.iinfo)):
        return O.OpaqueObjectVariable(value)
    if source is None:
        return O.OpaqueObjectVariable(value)
    if MO.is_model_output_cls(type(value)):
        return MO.ModelOutputVariable.existing(tx, value, source)
    guard(GuardKind.TYPE, type(value))
    return O.UserObjectVariable(value, source)


def _user_rule(value, source):
    """The tracker the user's own rules (ember/control.py) ask for, or None."""
    from ember.frontend.variables import functions as F

    msg = trace_rules.forbidden_message(value)
    if msg is not None:
        return F.ForbiddenCallableVariable(value, msg, source)
    reason = trace_rules.disabled_reason(value)
    if reason is not None:
        return F.DisabledFunctionVariable(value, reason, source)
    poly = trace_rules.polyfill_of(value)
    if poly is not None:
        return F.PolyfilledFunctionVariable(value, poly[0], poly[1], source)
    if trace_rules.is_allowed_in_graph(value):
        return F.TorchFunctionVariable(value, source)
    return None
