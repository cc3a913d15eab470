"""Python objects: modules, classes, user objects (existing or made in the trace), super()."""
from __future__ import annotations

import inspect
import operator
import types

import torch

from ember.frontend.errors import TracedException, Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import AttrSource, ItemSource
from ember.frontend.variables.base import (
    CONST_TYPES, ConstantVariable, VariableTracker, guard, guard_id, guard_no_attr, helpers, identity_of,
    is_plain_namedtuple_cls,
    register_builder, register_fallback, trackers,
)
from ember.frontend.variables.dicts import DictVariable

_TRUSTED_MODULE_PREFIXES = ("torch", "math", "operator", "functools", "itertools", "collections", "dataclasses",
                            "typing", "inspect", "warnings", "logging", "numbers", "enum", "builtins", "copy",
                            "types", "abc", "contextlib", "transformers.utils", "importlib")


def _is_trusted(mod: types.ModuleType) -> bool:
    name = mod.__name__
    return any(name == p or name.startswith(p + ".") for p in _TRUSTED_MODULE_PREFIXES)


class PythonModuleVariable(VariableTracker):
    identity_attr = "value"

    def __init__(self, module: types.ModuleType, source=None):
        self.value = module
        self.source = source

    def python_type(self):
        return types.ModuleType

    def describe(self):
        return f"module {self.value.__name__}"

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return cg.const(self.value, self.value.__name__)  # a module is one object per process

    def getattr(self, tx, name):
        val = getattr(self.value, name)
        if _is_trusted(self.value) or self.source is None:
            if isinstance(val, CONST_TYPES):
                return ConstantVariable(val)
            if callable(val) or isinstance(val, types.ModuleType):
                return VariableTracker.build_object(tx, val)
            src = tx.output.object_source(val, f"{self.value.__name__}.{name}")
            return VariableTracker.build(tx, val, src)
        return VariableTracker.build(tx, val, AttrSource(self.source, name))


def call_python(tx, fn: types.FunctionType, args: list, kwargs: dict | None = None):
    """Inline a Python function reached through a class (a dunder, a property getter...)."""
    fn_vt = trackers.UserFunctionVariable(fn, tx.output.object_source(fn, fn.__qualname__))
    return tx.inline_call(fn_vt, args, kwargs or {})


@helpers.add
def python_dunder(cls: type, name: str):
    """``cls``'s own Python implementation of ``name`` (None where object's or C's applies)."""
    fn, _ = lookup_static(cls, name)
    return fn if isinstance(fn, types.FunctionType) else None


def lookup_static(cls: type, name: str):
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name], klass
    return None, None


@helpers.add
def class_attr_of_instance(tx, self_vt, cls, name, self_source=None):
    """Resolve ``instance.name`` through the class: methods bind, properties are inlined."""
    static, owner = lookup_static(cls, name)
    if owner is None:  # (a class attribute may be None: `_compiled_call_impl = None` on nn.Module)
        raise AttributeError(f"'{cls.__name__}' object has no attribute '{name}'")
    if isinstance(static, property):
        if isinstance(static.fget, types.FunctionType):
            return call_python(tx, static.fget, [self_vt])
        raise Unsupported(f"property {cls.__name__}.{name} implemented in C")
    if isinstance(static, staticmethod):
        fn = static.__func__
        return VariableTracker.build(tx, fn, tx.output.object_source(fn, f"{cls.__name__}.{name}"))
    if isinstance(static, classmethod):
        cls_vt = VariableTracker.build(tx, cls, tx.output.object_source(cls, cls.__name__))
        return trackers.UserMethodVariable(static.__func__, cls_vt)
    if isinstance(static, types.FunctionType):
        return trackers.UserMethodVariable(static, self_vt)
    if hasattr(type(static), "__get__") and not isinstance(static, (int, float, str, tuple)):
        if self_source is not None:
            if tx.output.side_effects and isinstance(lookup_static(type(static), "__get__")[0], types.FunctionType):
                # its __get__ would run now on the object as it was at entry, without the writes this
                # trace has pending (an attribute, ``obj.__dict__[k] = v``, a global), and the guard would
                # pin that stale value (PyTorch's test_misc.test_dict_descriptor_interaction): a break
                # applies them first, and the read is traced again in the frame that resumes
                raise Unsupported(f"descriptor {cls.__name__}.{name} read after writes this trace has not applied")
            return VariableTracker.build(tx, getattr(self_vt.value, name), AttrSource(self_source, name))
        if type(static).__name__ in ("method_descriptor", "wrapper_descriptor"):
            return trackers.UserMethodVariable(static, self_vt)
        get, _ = lookup_static(type(static), "__get__")
        if isinstance(get, types.FunctionType) and lookup_static(type(static), "__set__")[0] is None \
                and lookup_static(type(static), "__delete__")[0] is None:
            # a Python non-data descriptor (torch.distributions' lazy_property): the instance dict was
            # looked at first, as Python does, so its __get__ is what Python calls now
            desc = VariableTracker.build(tx, static, tx.output.object_source(static, f"{cls.__name__}.{name}"))
            owner_vt = VariableTracker.build(tx, cls, tx.output.object_source(cls, cls.__name__))
            return call_python(tx, get, [desc, self_vt, owner_vt])
        raise Unsupported(f"descriptor {cls.__name__}.{name} ({type(static).__name__})")
    if isinstance(static, (int, float, str, bool, type(None), tuple, frozenset)):
        return VariableTracker.const(static)
    return VariableTracker.build(tx, static, tx.output.object_source(static, f"{cls.__name__}.{name}"))


class UserClassVariable(VariableTracker):
    identity_attr = "value"

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
        static, _ = lookup_static(self.value, name)
        if isinstance(static, classmethod):
            return trackers.UserMethodVariable(static.__func__, self)
        if isinstance(static, staticmethod):
            static = static.__func__
        val = static if isinstance(static, types.FunctionType) else getattr(self.value, name)
        written = tx.output.side_effects.load_attr(self.value, name)
        if written is not None:
            return written
        # guarded through the class (class attributes are mutable state, not constants)
        owner = self.source if self.source is not None else tx.output.object_source(self.value, self.value.__qualname__)
        return VariableTracker.build(tx, val, AttrSource(owner, name))

    def setattr(self, tx, name, value):
        if type(self.value) is not type:
            raise Unsupported(f"setting attribute '{name}' of class {self.value.__qualname__} with a metaclass")
        if self.source is None:
            self.source = tx.output.object_source(self.value, self.value.__qualname__)
        tx.output.side_effects.store_attr(self, self.value, name, value)

    def call(self, tx, args, kwargs):
        cls = self.value
        if is_plain_namedtuple_cls(cls):
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
            return trackers.NamedTupleVariable(cls, vals)

        if helpers.is_model_output_cls(cls):
            return trackers.ModelOutputVariable.create(tx, cls, args, kwargs)

        built = helpers.construct_builtin_type(tx, cls, args, kwargs)
        if built is not None:
            return built
        if issubclass(cls, BaseException):
            if not helpers.is_modelled_exception(cls):
                raise Unsupported(f"creating exception {cls.__name__}")
            return helpers.make_exception(tx, cls, list(args), kwargs)
        if is_nn_module_cls(cls):
            made = helpers.create_module(tx, cls, args, kwargs)
            if made is not None:
                return made
        if helpers.is_plain_dict_subclass(cls):
            return helpers.make_user_dict(tx, cls, list(args), kwargs)
        if cls.__new__ is not object.__new__ or not cls.__dictoffset__:
            raise Unsupported(f"creating an instance of {cls.__qualname__} (custom __new__, __slots__ or a C type)")
        obj = NewObjectVariable(cls)
        init, _ = lookup_static(cls, "__init__")
        if isinstance(init, types.FunctionType):
            call_python(tx, init, [obj, *args], kwargs)
        elif init is not object.__init__:
            raise Unsupported(f"creating {cls.__qualname__}: its __init__ is implemented in C")
        elif args or kwargs:
            raise Unsupported(f"{cls.__qualname__}() takes no arguments")
        return obj

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return cg.const(self.value, self.value.__name__)


def _known_type(vt):
    """The Python type of what ``vt`` stands for, or None where the tracker cannot say."""
    try:
        return vt.python_type()
    except Unsupported:
        return None


class _ObjectProtocol(VariableTracker):
    """bool(), len() and iteration of an instance of a user class, through its class's dunders."""

    def truth(self, tx):
        cls = self.python_type()
        if lookup_static(cls, "__bool__")[0] is None and lookup_static(cls, "__len__")[0] is None:
            return True
        if lookup_static(cls, "__bool__")[0] is not None:
            out = self.call_method(tx, "__bool__", [], {})
            if _known_type(out) not in (bool, None):  # CPython raises on anything but a bool
                raise TracedException(TypeError, [ConstantVariable(
                    f"__bool__ should return bool, returned {_known_type(out).__name__}")],
                    "__bool__ did not return a bool")
            return out.truth(tx)
        return self.length(tx) != 0

    def length(self, tx):
        if python_dunder(self.python_type(), "__len__") is None:
            raise Unsupported(f"len() of {self.describe()}")
        out = self.call_method(tx, "__len__", [], {})
        if not out.is_constant():
            return out.as_constant()
        try:  # CPython's len() takes an index (int, or __index__), never a float
            n = operator.index(out.as_constant())
        except TypeError as exc:
            raise TracedException(TypeError, [ConstantVariable(str(exc))], "__len__ did not return an int") from None
        if n < 0:
            raise TracedException(ValueError, [ConstantVariable("__len__() should return >= 0")], "__len__ < 0")
        return n

    def unpack(self, tx):
        if python_dunder(self.python_type(), "__iter__") is None:
            raise Unsupported(f"iterating over {self.describe()}")
        return self.call_method(tx, "__iter__", [], {}).unpack(tx)


class UserObjectVariable(_ObjectProtocol):
    """An existing object reached through a source: attributes are read for real and guarded."""

    identity_attr = "value"

    def __init__(self, value, source):
        self.value = value
        self.source = source

    def python_type(self):
        return type(self.value)

    def describe(self):
        return f"{type(self.value).__qualname__} object at {self.source.name()}"

    def getattr(self, tx, name):
        obj, cls = self.value, type(self.value)
        if python_dunder(cls, "__getattribute__") is not None and name not in ("__class__", "__dict__") \
                and tx.output.side_effects.load_attr(obj, name) is None:
            # a Python __getattribute__ (e.g. configs with attribute aliases): read for real, guard the value
            return VariableTracker.build(tx, getattr(obj, name), AttrSource(self.source, name))
        try:
            return self.generic_getattr(tx, name)
        except AttributeError:
            ga = python_dunder(cls, "__getattr__")
            if ga is None:
                raise
            return call_python(tx, ga, [self, ConstantVariable(name)])

    def generic_getattr(self, tx, name):
        """What ``object.__getattribute__`` finds: pending writes, the instance dict, then the class."""
        obj, cls = self.value, type(self.value)
        pending = tx.output.side_effects.load_attr(obj, name)
        if pending is not None:
            return pending
        if name == "__class__":
            return VariableTracker.build(tx, cls, tx.output.object_source(cls, cls.__name__))
        if name == "__dict__":
            raise Unsupported(f"reading __dict__ of {self.describe()}")
        static, owner = lookup_static(cls, name)
        # (CPython: a data descriptor has __get__ and __set__ or __delete__; one with __set__ alone
        # does not hide the instance dict)
        kind = type(static)
        is_data_descr = static is not None and hasattr(kind, "__get__") and \
            (hasattr(kind, "__set__") or hasattr(kind, "__delete__"))
        inst_dict = getattr(obj, "__dict__", {})
        if not is_data_descr and name in inst_dict:
            # read through __dict__ where `obj.name` would run the class's own __getattribute__
            src = AttrSource(self.source, name) if python_dunder(cls, "__getattribute__") is None else \
                ItemSource(AttrSource(self.source, "__dict__"), name)
            return VariableTracker.build(tx, inst_dict[name], src)
        if owner is not None:
            return class_attr_of_instance(tx, self, cls, name, self_source=self.source)
        guard_no_attr(tx, self, name)  # __getattr__ (or the caller) takes over: the name must stay absent
        raise AttributeError(f"'{cls.__name__}' object has no attribute '{name}'")

    def setattr(self, tx, name, value):
        if name == "__class__":  # the tracker's type would no longer be the object's
            raise Unsupported(f"assigning __class__ of {self.describe()}")
        cls = type(self.value)
        sa, _ = lookup_static(cls, "__setattr__")
        static, _ = lookup_static(cls, name)
        if sa is not object.__setattr__ or (static is not None and hasattr(type(static), "__set__")):
            raise Unsupported(f"setting attribute '{name}' of {self.describe()} (custom __setattr__ or descriptor)")
        tx.output.side_effects.store_attr(self, self.value, name, value)

    def call(self, tx, args, kwargs):
        call, _ = lookup_static(type(self.value), "__call__")
        if isinstance(call, types.FunctionType):
            return trackers.UserMethodVariable(call, self).call(tx, args, kwargs)
        raise Unsupported(f"calling {self.describe()}")


class NewObjectVariable(_ObjectProtocol):
    """An instance of a user class created inside the trace; rebuilt at the end if it escapes."""

    def __init__(self, cls):
        self.cls = cls
        self.attrs: dict[str, VariableTracker] = {}

    def python_type(self):
        return self.cls

    def describe(self):
        return f"new {self.cls.__qualname__} object"

    def getattr(self, tx, name):
        ga = python_dunder(self.cls, "__getattribute__")
        if ga is None:
            try:
                return self.generic_getattr(tx, name)
            except AttributeError:
                return self._getattr_fallback(tx, name)
        try:  # e.g. configs mapping attribute aliases; an AttributeError it raises is the protocol's
            return call_python(tx, ga, [self, ConstantVariable(name)])
        except TracedException as exc:
            if not issubclass(exc.exc_type, AttributeError):
                raise
            return self._getattr_fallback(tx, name)

    def generic_getattr(self, tx, name):
        """What ``object.__getattribute__`` finds: instance attributes, then the class."""
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return UserClassVariable(self.cls)
        if name == "__dict__":
            return ObjectDictVariable(self)
        if lookup_static(self.cls, name)[1] is None:  # (the class's value may be None itself)
            raise AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'")
        return class_attr_of_instance(tx, self, self.cls, name)

    def _getattr_fallback(self, tx, name):
        ga = python_dunder(self.cls, "__getattr__")
        if ga is None:
            raise AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'")
        return call_python(tx, ga, [self, ConstantVariable(name)])

    def setattr(self, tx, name, value):
        if name == "__class__":  # isinstance and method lookups read self.cls: not modelled
            raise Unsupported(f"assigning __class__ of {self.describe()}")
        sa = python_dunder(self.cls, "__setattr__")
        if sa is not None:
            call_python(tx, sa, [self, ConstantVariable(name), value])
            return
        self.attrs[name] = value

    def delattr(self, tx, name):
        da = python_dunder(self.cls, "__delattr__")
        if da is not None:
            call_python(tx, da, [self, ConstantVariable(name)])
            return
        self.generic_delattr(tx, name)

    def generic_delattr(self, tx, name):
        if name not in self.attrs:
            raise TracedException(AttributeError, [ConstantVariable(name)],
                                  f"deleting missing attribute '{name}' of {self.describe()} (AttributeError)")
        del self.attrs[name]

    def call(self, tx, args, kwargs):
        return self.call_method(tx, "__call__", args, kwargs)

    def reconstruct(self, cg):
        def build():
            body = "{" + ", ".join(f"{k!r}: {cg.reconstruct(v)}" for k, v in self.attrs.items()) + "}"
            return f"__new_object({cg.const(self.cls, self.cls.__name__)}, {body})"

        return cg.memo(self, build)


class ObjectDictVariable(DictVariable):
    """``obj.__dict__`` of an object made in the trace: a dict whose items are the object's attributes."""

    def __init__(self, owner: NewObjectVariable):  # no DictVariable.__init__: it would reset the items
        self.owner = owner
        self.default_factory = None
        self.key_vts = {}
        self.source = None
        self.py_type = dict

    @property
    def items(self):
        return self.owner.attrs

    @items.setter
    def items(self, new):
        attrs = dict(new)
        self.owner.attrs.clear()
        self.owner.attrs.update(attrs)

    def reconstruct(self, cg):
        return f"{cg.reconstruct(self.owner)}.__dict__"


def new_object(cls, attrs: dict):
    """Runtime helper of generated code: an instance of ``cls`` with ``attrs``, without calling __init__."""
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def is_nn_module_cls(cls) -> bool:
    return issubclass(cls, torch.nn.Module)


class OpaqueObjectVariable(VariableTracker):
    """An object made while tracing that ember only knows as a value (e.g. torch.finfo)."""

    identity_attr = "value"

    def __init__(self, value):
        self.value = value

    def python_type(self):
        return type(self.value)

    def describe(self):
        return f"{type(self.value).__qualname__} object"

    # read-only lookups answered on the real value (a signature's ``parameters`` mappingproxy, ...);
    # read as attributes too, so ``obj.keys()`` (a method load, then a call) reaches call_method
    _LOOKUPS = ("keys", "values", "items", "get", "__contains__", "__len__")

    def getattr(self, tx, name):
        val = getattr(self.value, name)
        if name in self._LOOKUPS and isinstance(val, types.BuiltinMethodType):
            return trackers.BoundMethodVariable(self, name)
        if inspect.ismethod(val) and isinstance(val.__func__, types.FunctionType):
            return trackers.UserMethodVariable(val.__func__, self)
        return VariableTracker.const(val)

    def _read(self, what, fn):
        try:
            return fn()
        except TypeError:
            raise Unsupported(f"{what} of {self.describe()}") from None

    def length(self, tx):
        return self._read("len()", lambda: len(self.value))

    def unpack(self, tx):
        return self._read("iterating", lambda: [VariableTracker.const(v) for v in self.value])

    def truth(self, tx):
        return bool(self.value)

    def getitem(self, tx, key):
        return self._read("indexing", lambda: VariableTracker.const(self.value[key.as_constant()]))

    def call_method(self, tx, name, args, kwargs):
        if all(a.is_constant() for a in [*args, *kwargs.values()]) and name in self._LOOKUPS:
            return VariableTracker.const(getattr(self.value, name)(*[a.as_constant() for a in args]))
        return self.getattr(tx, name).call(tx, args, kwargs)

    def reconstruct(self, cg):
        return cg.const(self.value, type(self.value).__name__)


@helpers.add
def hashable_key(vt: VariableTracker):
    """What a set member or dict key hashes by: the underlying object (by identity); an object made
    in the trace hashes by its tracker, which is its identity, unless its class hashes by value."""

    if isinstance(vt, trackers.TensorVariable):
        return vt.node  # one tracker (and node) per tensor object: identity semantics, like Tensor.__hash__
    if isinstance(vt, trackers.TupleVariable):  # tuples hash and compare by their items (a namedtuple too)
        return ("tuple", tuple(i.as_constant() if i.is_constant() else hashable_key(i) for i in vt.items))
    obj = identity_of(vt)
    if obj is vt:
        if isinstance(vt, NewObjectVariable) and all(
                lookup_static(vt.cls, n)[1] in (None, object) for n in ("__hash__", "__eq__")):
            return vt
        raise Unsupported(f"using {vt.describe()} as a dict key or set member")
    try:
        hash(obj)
        return obj
    except TypeError:
        raise Unsupported(f"using {vt.describe()} as a dict key") from None


class SuperVariable(VariableTracker):
    """``super()`` / ``super(cls, obj)``: attribute lookup starts after ``cls`` in obj's MRO."""

    def __init__(self, cls, obj: VariableTracker):
        self.cls = cls
        self.obj = obj

    def describe(self):
        return f"super({self.cls.__name__})"

    def getattr(self, tx, name):
        mro = self.obj.python_type().__mro__
        start = mro.index(self.cls) + 1 if self.cls in mro else 0
        for klass in mro[start:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if klass is object and name in ("__init__", "__init_subclass__"):
                    return _NoOpVariable()
                if isinstance(attr, types.FunctionType):
                    return trackers.UserMethodVariable(attr, self.obj)
                if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType):
                    getter = tx.output.object_source(attr.fget, attr.fget.__qualname__)
                    return tx.inline_call(trackers.UserFunctionVariable(attr.fget, getter), [self.obj], {})
                if isinstance(attr, classmethod):
                    cls = self.obj.python_type()
                    cls_vt = VariableTracker.build(tx, cls, tx.output.object_source(cls, "cls"))
                    return trackers.UserMethodVariable(attr.__func__, cls_vt)
                if isinstance(attr, staticmethod):
                    return VariableTracker.build(tx, attr.__func__, tx.output.object_source(attr.__func__, name))
                if name == "__init__" and isinstance(self.obj, trackers.ExceptionVariable):
                    return trackers.BoundMethodVariable(self.obj, name)  # BaseException.__init__: sets args
                if name == "__init__" and klass is dict and isinstance(self.obj, trackers.UserDictVariable):
                    return trackers.BoundMethodVariable(self.obj, "__dict_init__")
                if type(attr).__name__ in ("method_descriptor", "wrapper_descriptor"):
                    return trackers.UserMethodVariable(attr, self.obj)
                raise Unsupported(f"super().{name} ({type(attr).__name__})")
        raise AttributeError(f"'super' object has no attribute '{name}'")


class _NoOpVariable(VariableTracker):
    def call(self, tx, args, kwargs):
        return ConstantVariable(None)


# -- builders: modules, classes, and the user-object fallback --------------------------------------

@register_builder(types.ModuleType, kind="object")
def _build_python_module(tx, value, source):
    guard_id(tx, value, source)
    return PythonModuleVariable(value, source)


@register_builder(type, kind="object")
def _build_class(tx, value, source):
    guard_id(tx, value, source)
    return UserClassVariable(value, source)


@register_builder(torch.finfo, torch.iinfo, kind="object")
def _build_opaque(tx, value, source):
    return OpaqueObjectVariable(value)


@register_fallback
def _build_user_object(tx, value, source):
    if source is None:  # made while tracing by code ember does not trace: opaque
        return OpaqueObjectVariable(value)
    guard(tx, source, GuardKind.TYPE, type(value))
    return UserObjectVariable(value, source)
