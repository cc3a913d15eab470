"""Python objects: modules, classes, user objects (existing or made in the trace), ModelOutputs."""
from __future__ import annotations

import collections
import dataclasses
import inspect
import types

from ember.frontend.errors import Unsupported
from ember.frontend.sources import AttrSource
from ember.frontend.variables.base import ConstantVariable, VariableTracker

_TRUSTED_MODULE_PREFIXES = ("torch", "math", "operator", "functools", "itertools", "collections", "dataclasses",
                            "typing", "inspect", "warnings", "logging", "numbers", "enum", "builtins", "copy",
                            "types", "abc", "contextlib", "transformers.utils", "importlib")


def _is_trusted(mod: types.ModuleType) -> bool:
    name = mod.__name__
    return any(name == p or name.startswith(p + ".") for p in _TRUSTED_MODULE_PREFIXES)


class PythonModuleVariable(VariableTracker):
    def __init__(self, module: types.ModuleType, source=None):
        self.value = module
        self.source = source

    def python_type(self):
        return types.ModuleType

    def describe(self):
        return f"module {self.value.__name__}"

    def getattr(self, tx, name):
        from ember.frontend.variables.builder import _wrap_object, wrap, wrap_const, _CONST_TYPES

        val = getattr(self.value, name)
        if _is_trusted(self.value) or self.source is None:
            if isinstance(val, _CONST_TYPES):
                return ConstantVariable(val)
            if callable(val) or isinstance(val, types.ModuleType):
                return _wrap_object(tx, val, None)
            src = tx.output.object_source(val, f"{self.value.__name__}.{name}")
            return wrap(tx, val, src)
        return wrap(tx, val, AttrSource(self.source, name))


def lookup_static(cls: type, name: str):
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name], klass
    return None, None


def class_attr_of_instance(tx, self_vt, cls, name, self_source=None):
    """Resolve ``instance.name`` through the class: methods bind, properties are inlined."""
    from ember.frontend.variables.builder import wrap, wrap_const
    from ember.frontend.variables.functions import UserFunctionVariable, UserMethodVariable

    static, owner = lookup_static(cls, name)
    if static is None:
        raise AttributeError(f"'{cls.__name__}' object has no attribute '{name}'")
    if isinstance(static, property):
        if isinstance(static.fget, types.FunctionType):
            return tx.inline_call(UserFunctionVariable(static.fget, tx.output.object_source(static.fget, static.fget.__qualname__)), [self_vt], {})
        raise Unsupported(f"property {cls.__name__}.{name} implemented in C")
    if isinstance(static, staticmethod):
        return wrap(tx, static.__func__, tx.output.object_source(static.__func__, f"{cls.__name__}.{name}"))
    if isinstance(static, classmethod):
        return UserMethodVariable(static.__func__, wrap(tx, cls, tx.output.object_source(cls, cls.__name__)))
    if isinstance(static, types.FunctionType):
        return UserMethodVariable(static, self_vt)
    if hasattr(type(static), "__get__") and not isinstance(static, (int, float, str, tuple)):
        if self_source is not None:
            return wrap(tx, getattr(self_vt.value, name), AttrSource(self_source, name))
        if type(static).__name__ in ("method_descriptor", "wrapper_descriptor"):
            return UserMethodVariable(static, self_vt)
        raise Unsupported(f"descriptor {cls.__name__}.{name} ({type(static).__name__})")
    return wrap(tx, static, tx.output.object_source(static, f"{cls.__name__}.{name}")) if not isinstance(
        static, (int, float, str, bool, type(None), tuple, frozenset)) else wrap_const(static)


class UserClassVariable(VariableTracker):
    def __init__(self, cls: type, source=None):
        self.value = cls
        self.source = source

    def python_type(self):
        return type(self.value)

    def describe(self):
        return f"class {self.value.__qualname__}"

    def is_constant(self):
        return True

    def as_constant(self):
        return self.value

    def getattr(self, tx, name):
        from ember.frontend.variables.builder import wrap, wrap_const
        from ember.frontend.variables.functions import UserMethodVariable

        static, _ = lookup_static(self.value, name)
        if isinstance(static, classmethod):
            return UserMethodVariable(static.__func__, self)
        if isinstance(static, staticmethod):
            static = static.__func__
        val = static if isinstance(static, types.FunctionType) else getattr(self.value, name)
        written = tx.output.side_effects.load_attr(self.value, name)
        if written is not None:
            return written
        # guarded through the class (class attributes are mutable state, not constants)
        owner = self.source if self.source is not None else tx.output.object_source(self.value, self.value.__qualname__)
        return wrap(tx, val, AttrSource(owner, name))

    def setattr(self, tx, name, value):
        if type(self.value) is not type:
            raise Unsupported(f"setting attribute '{name}' of class {self.value.__qualname__} with a metaclass")
        if self.source is None:
            self.source = tx.output.object_source(self.value, self.value.__qualname__)
        tx.output.side_effects.store_attr(self, self.value, name, value)

    def call(self, tx, args, kwargs):
        from ember.frontend.variables.builder import is_namedtuple_cls
        from ember.frontend.variables.containers import NamedTupleVariable, TupleVariable

        cls = self.value
        if is_namedtuple_cls(cls):
            fields = cls._fields
            vals = list(args) + [None] * (len(fields) - len(args))
            for k, v in kwargs.items():
                vals[fields.index(k)] = v
            for i, f in enumerate(fields):
                if vals[i] is None:
                    if f in cls._field_defaults:
                        vals[i] = ConstantVariable(cls._field_defaults[f]) if not hasattr(cls._field_defaults[f], "__dict__") else None
                    if vals[i] is None:
                        raise Unsupported(f"namedtuple {cls.__name__} missing field {f}")
            return NamedTupleVariable(cls, vals)
        if is_model_output_cls(cls):
            return ModelOutputVariable.create(tx, cls, args, kwargs)
        from ember.frontend.builtins import construct_builtin_type

        built = construct_builtin_type(tx, cls, args, kwargs)
        if built is not None:
            return built
        if issubclass(cls, BaseException):
            raise Unsupported(f"creating exception {cls.__name__}")
        if cls.__new__ is not object.__new__ or not cls.__dictoffset__:
            raise Unsupported(f"creating an instance of {cls.__qualname__} (custom __new__, __slots__ or a C type)")
        obj = NewObjectVariable(cls)
        init, _ = lookup_static(cls, "__init__")
        if isinstance(init, types.FunctionType):
            from ember.frontend.variables.functions import UserFunctionVariable

            tx.inline_call(UserFunctionVariable(init, tx.output.object_source(init, init.__qualname__)), [obj, *args], kwargs)
        elif init is not object.__init__:
            raise Unsupported(f"creating {cls.__qualname__}: its __init__ is implemented in C")
        elif args or kwargs:
            raise Unsupported(f"{cls.__qualname__}() takes no arguments")
        return obj

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return cg.const(self.value, self.value.__name__)


class UserObjectVariable(VariableTracker):
    """An existing object reached through a source: attributes are read for real and guarded."""

    def __init__(self, value, source):
        self.value = value
        self.source = source

    def python_type(self):
        return type(self.value)

    def describe(self):
        return f"{type(self.value).__qualname__} object at {self.source.name()}"

    def getattr(self, tx, name):
        from ember.frontend.variables.builder import wrap

        obj, cls = self.value, type(self.value)
        pending = tx.output.side_effects.load_attr(obj, name)
        if pending is not None:
            return pending
        if name == "__class__":
            return wrap(tx, cls, tx.output.object_source(cls, cls.__name__))
        if name == "__dict__":
            raise Unsupported(f"reading __dict__ of {self.describe()}")
        getattribute, _ = lookup_static(cls, "__getattribute__")
        if getattribute is not object.__getattribute__:
            # a Python __getattribute__ (e.g. configs with attribute aliases): read for real, guard the value
            return wrap(tx, getattr(obj, name), AttrSource(self.source, name))
        static, _ = lookup_static(cls, name)
        is_data_descr = static is not None and hasattr(type(static), "__set__")
        inst_dict = getattr(obj, "__dict__", {})
        if not is_data_descr and name in inst_dict:
            return wrap(tx, inst_dict[name], AttrSource(self.source, name))
        if static is not None:
            return class_attr_of_instance(tx, self, cls, name, self_source=self.source)
        ga, _ = lookup_static(cls, "__getattr__")
        if isinstance(ga, types.FunctionType):
            from ember.frontend.variables.functions import UserFunctionVariable

            return tx.inline_call(UserFunctionVariable(ga, tx.output.object_source(ga, ga.__qualname__)), [self, ConstantVariable(name)], {})
        raise AttributeError(f"'{cls.__name__}' object has no attribute '{name}'")

    def setattr(self, tx, name, value):
        cls = type(self.value)
        sa, _ = lookup_static(cls, "__setattr__")
        static, _ = lookup_static(cls, name)
        if sa is not object.__setattr__ or (static is not None and hasattr(type(static), "__set__")):
            raise Unsupported(f"setting attribute '{name}' of {self.describe()} (custom __setattr__ or descriptor)")
        tx.output.side_effects.store_attr(self, self.value, name, value)

    def call(self, tx, args, kwargs):
        call, _ = lookup_static(type(self.value), "__call__")
        if isinstance(call, types.FunctionType):
            from ember.frontend.variables.functions import UserMethodVariable

            return UserMethodVariable(call, self).call(tx, args, kwargs)
        raise Unsupported(f"calling {self.describe()}")

    def truth(self, tx):
        cls = type(self.value)
        if lookup_static(cls, "__bool__")[0] is None and lookup_static(cls, "__len__")[0] is None:
            return True
        return self.call_method(tx, "__bool__" if lookup_static(cls, "__bool__")[0] else "__len__", [], {}).truth(tx)


class NewObjectVariable(VariableTracker):
    """An instance of a user class created inside the trace; rebuilt at the end if it escapes."""

    def __init__(self, cls):
        self.cls = cls
        self.attrs: dict[str, VariableTracker] = {}

    def python_type(self):
        return self.cls

    def describe(self):
        return f"new {self.cls.__qualname__} object"

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return UserClassVariable(self.cls)
        if name == "__dict__":
            raise Unsupported("reading __dict__ of an object made in the compiled function")
        static, _ = lookup_static(self.cls, name)
        if static is None:
            ga, _ = lookup_static(self.cls, "__getattr__")
            if isinstance(ga, types.FunctionType):
                from ember.frontend.variables.functions import UserFunctionVariable

                return tx.inline_call(UserFunctionVariable(ga, tx.output.object_source(ga, ga.__qualname__)), [self, ConstantVariable(name)], {})
            raise AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'")
        return class_attr_of_instance(tx, self, self.cls, name)

    def setattr(self, tx, name, value):
        sa, _ = lookup_static(self.cls, "__setattr__")
        if sa is not object.__setattr__ and isinstance(sa, types.FunctionType):
            from ember.frontend.variables.functions import UserFunctionVariable

            tx.inline_call(UserFunctionVariable(sa, tx.output.object_source(sa, sa.__qualname__)), [self, ConstantVariable(name), value], {})
            return
        self.attrs[name] = value

    def call(self, tx, args, kwargs):
        return self.call_method(tx, "__call__", args, kwargs)

    def truth(self, tx):
        if lookup_static(self.cls, "__bool__")[0] is None and lookup_static(self.cls, "__len__")[0] is None:
            return True
        return self.call_method(tx, "__bool__" if lookup_static(self.cls, "__bool__")[0] else "__len__", [], {}).truth(tx)

    def reconstruct(self, cg):
        def build():
            body = "{" + ", ".join(f"{k!r}: {cg.reconstruct(v)}" for k, v in self.attrs.items()) + "}"
            return f"__new_object({cg.const(self.cls, self.cls.__name__)}, {body})"

        return cg.memo(self, build)


def new_object(cls, attrs: dict):
    """Runtime helper of generated code: an instance of ``cls`` with ``attrs``, without calling __init__."""
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def is_model_output_cls(cls) -> bool:
    """Hugging Face ModelOutput: a dataclass that is also an OrderedDict of its non-None fields."""
    return isinstance(cls, type) and issubclass(cls, collections.OrderedDict) and dataclasses.is_dataclass(cls)


class ModelOutputVariable(VariableTracker):
    def __init__(self, cls, values: dict):
        self.cls = cls
        self.values = values  # field name -> VT, only non-None fields, in field order

    @staticmethod
    def create(tx, cls, args, kwargs):
        names = [f.name for f in dataclasses.fields(cls)]
        bound = dict(zip(names, args))
        bound.update(kwargs)
        vals = {}
        for n in names:
            v = bound.get(n)
            if v is None or (v.is_constant() and v.as_constant() is None):
                continue
            vals[n] = v
        return ModelOutputVariable(cls, vals)

    def python_type(self):
        return self.cls

    def describe(self):
        return f"{self.cls.__name__}"

    def getattr(self, tx, name):
        from ember.frontend.variables.functions import BoundMethodVariable

        names = [f.name for f in dataclasses.fields(self.cls)]
        if name in self.values:
            return self.values[name]
        if name in names:
            return ConstantVariable(None)
        if name in ("to_tuple", "keys", "values", "items", "get", "__getitem__", "__contains__", "__len__"):
            return BoundMethodVariable(self, name)
        return class_attr_of_instance(tx, self, self.cls, name)

    def setattr(self, tx, name, value):
        self.values[name] = value

    def unpack(self, tx):
        return [ConstantVariable(k) for k in self.values]

    def length(self, tx):
        return len(self.values)

    def truth(self, tx):
        return bool(self.values)

    def call_method(self, tx, name, args, kwargs):
        from ember.frontend.variables.containers import DictViewVariable, DictVariable, TupleVariable

        if name == "to_tuple":
            return TupleVariable(list(self.values.values()))
        if name == "__getitem__":
            k = args[0].as_constant()
            if isinstance(k, str):
                return self.values[k]
            return TupleVariable(list(self.values.values())).getitem(tx, args[0])
        if name == "__setitem__":
            self.values[args[0].as_constant()] = args[1]
            return ConstantVariable(None)
        if name in ("keys", "values", "items"):
            return DictViewVariable(DictVariable(self.values), name)
        if name == "get":
            k = args[0].as_constant()
            return self.values.get(k, args[1] if len(args) > 1 else ConstantVariable(None))
        if name == "__contains__":
            return ConstantVariable(args[0].as_constant() in self.values)
        if name == "__len__":
            return ConstantVariable(len(self.values))
        return self.getattr(tx, name).call(tx, args, kwargs)

    def reconstruct(self, cg):
        return cg.memo(self, lambda: f"{cg.const(self.cls, self.cls.__name__)}(" + ", ".join(
            f"{k}={cg.reconstruct(v)}" for k, v in self.values.items()) + ")")


class OpaqueObjectVariable(VariableTracker):
    """An object made while tracing that ember only knows as a value (e.g. torch.finfo)."""

    def __init__(self, value):
        self.value = value

    def python_type(self):
        return type(self.value)

    def describe(self):
        return f"{type(self.value).__qualname__} object"

    def getattr(self, tx, name):
        from ember.frontend.variables.builder import wrap_const

        val = getattr(self.value, name)
        if inspect.ismethod(val) and isinstance(val.__func__, types.FunctionType):
            from ember.frontend.variables.functions import UserMethodVariable

            return UserMethodVariable(val.__func__, self)
        return wrap_const(val)

    def _read(self, what, fn):
        try:
            return fn()
        except TypeError:
            raise Unsupported(f"{what} of {self.describe()}") from None

    def length(self, tx):
        return self._read("len()", lambda: len(self.value))

    def unpack(self, tx):
        from ember.frontend.variables.builder import wrap_const

        return self._read("iterating", lambda: [wrap_const(v) for v in self.value])

    def truth(self, tx):
        return bool(self.value)

    def getitem(self, tx, key):
        from ember.frontend.variables.builder import wrap_const

        return self._read("indexing", lambda: wrap_const(self.value[key.as_constant()]))

    def call_method(self, tx, name, args, kwargs):
        if all(a.is_constant() for a in [*args, *kwargs.values()]) and name in ("keys", "values", "items", "get", "__contains__", "__len__"):
            from ember.frontend.variables.builder import wrap_const

            return wrap_const(getattr(self.value, name)(*[a.as_constant() for a in args]))
        return self.getattr(tx, name).call(tx, args, kwargs)

    def reconstruct(self, cg):
        return cg.const(self.value, type(self.value).__name__)


def hashable_key(vt: VariableTracker):
    """What a set member or dict key hashes by: the underlying object (by identity)."""
    from ember.frontend.variables.tensor import TensorVariable

    if isinstance(vt, TensorVariable):
        return vt.node  # one tracker (and node) per tensor object: identity semantics, like Tensor.__hash__
    for attr in ("module", "value", "fn", "cls"):
        if hasattr(vt, attr):
            obj = getattr(vt, attr)
            try:
                hash(obj)
                return obj
            except TypeError:
                break
    raise Unsupported(f"using {vt.describe()} as a dict key")


class SuperVariable(VariableTracker):
    """``super()`` / ``super(cls, obj)``: attribute lookup starts after ``cls`` in obj's MRO."""

    def __init__(self, cls, obj: VariableTracker):
        self.cls = cls
        self.obj = obj

    def describe(self):
        return f"super({self.cls.__name__})"

    def getattr(self, tx, name):
        from ember.frontend.variables.builder import wrap
        from ember.frontend.variables.functions import UserFunctionVariable, UserMethodVariable

        mro = self.obj.python_type().__mro__
        start = mro.index(self.cls) + 1 if self.cls in mro else 0
        for klass in mro[start:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if klass is object and name in ("__init__", "__init_subclass__"):
                    return _NoOpVariable()
                if isinstance(attr, types.FunctionType):
                    return UserMethodVariable(attr, self.obj)
                if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType):
                    return tx.inline_call(UserFunctionVariable(attr.fget, tx.output.object_source(attr.fget, attr.fget.__qualname__)), [self.obj], {})
                if isinstance(attr, classmethod):
                    return UserMethodVariable(attr.__func__, wrap(tx, self.obj.python_type(), tx.output.object_source(self.obj.python_type(), "cls")))
                if isinstance(attr, staticmethod):
                    return wrap(tx, attr.__func__, tx.output.object_source(attr.__func__, name))
                if type(attr).__name__ in ("method_descriptor", "wrapper_descriptor"):
                    return UserMethodVariable(attr, self.obj)
                raise Unsupported(f"super().{name} ({type(attr).__name__})")
        raise AttributeError(f"'super' object has no attribute '{name}'")


class _NoOpVariable(VariableTracker):
    def call(self, tx, args, kwargs):
        return ConstantVariable(None)
