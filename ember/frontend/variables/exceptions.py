"""Exception objects the traced program makes or raises (``KeyError('k')``, ``raise ValueError(...)``).

Builtin exception types' constructors just keep the arguments. A user's subclass of them is modelled
too when it has no ``__new__`` of its own: the object keeps ``args`` as ``BaseException.__new__``
does, its Python ``__init__`` is inlined (``super().__init__(msg)`` resets ``args``), and attributes
it sets live on the tracker. ``raise X from Y`` sets ``__cause__`` (and ``__suppress_context__``); a
raise while handling another exception sets ``__context__``, as CPython does. The interpreter catches
a ``TracedException`` in traced ``try`` blocks (interpreter.py, handlers/blocks.py).
"""
from __future__ import annotations

import builtins
import types

from ember.frontend.errors import TracedException, Unsupported
from ember.frontend.variables.base import ConstantVariable, VariableTracker, helpers, trackers


@helpers.add
def is_builtin_exception(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, BaseException) and getattr(builtins, cls.__name__, None) is cls


@helpers.add
def is_modelled_exception(cls) -> bool:
    """A builtin exception class, or a Python subclass of builtin ones without a ``__new__`` of its
    own (whose construction is then ``BaseException.__new__`` + its inlined ``__init__``)."""
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return False
    if is_builtin_exception(cls):
        return True
    for klass in cls.__mro__:
        if is_builtin_exception(klass) or klass is object:
            continue
        if not isinstance(klass.__dict__.get("__module__"), str) or "__new__" in klass.__dict__ \
                or "__slots__" in klass.__dict__:
            return False  # a C class in between, or one that makes its instances itself
    # the builtin bases must be ones whose constructor only stores args (OSError maps errno, ...)
    return not issubclass(cls, _STATEFUL_BUILTINS)


# builtin exceptions whose constructors set more than ``args`` (errno, name, code, value...)
_STATEFUL_BUILTINS = (OSError, SyntaxError, ImportError, StopIteration, StopAsyncIteration, SystemExit,
                      UnicodeError, AttributeError, NameError, BaseExceptionGroup)


@helpers.add
def make_exception(tx, cls, args: list, kwargs: dict) -> "ExceptionVariable":
    """``cls(*args, **kwargs)`` for a modelled exception class."""
    exc = ExceptionVariable(cls, list(args))
    init = None
    for klass in cls.__mro__:
        if "__init__" in klass.__dict__:
            init = klass.__dict__["__init__"]
            break
    if isinstance(init, types.FunctionType):
        _inline(tx, init, [exc, *args], kwargs)
    elif kwargs:
        raise Unsupported(f"{cls.__name__}() takes no keyword arguments (TypeError)")
    return exc


_NO_VALUE = object()


class ExceptionVariable(VariableTracker):
    def __init__(self, cls: type, args: list):
        self.cls = cls
        self.args = list(args)
        self.attrs: dict = {}  # attributes the program set (a user exception's __init__: self.code = ...)
        self.cause = None  # trackers, None while unset
        self.context = None
        self.suppress_context = False

    def python_type(self):
        return self.cls

    def is_constant(self):
        return all(a.is_constant() for a in [*self.args, *self.attrs.values()]) and not (self.cause or self.context)

    def as_constant(self):
        """The real exception (one object per tracker, so ``is`` holds): str(), repr() and
        comparisons of it fold."""
        if getattr(self, "_real", None) is None:
            if not all(v.is_constant() for v in self.attrs.values()) or self.cause or self.context:
                raise Unsupported(f"{self.describe()} is not a Python constant here")
            self._real = _rebuild(self.cls, tuple(a.as_constant() for a in self.args),
                                  {k: v.as_constant() for k, v in self.attrs.items()})
        return self._real

    def describe(self):
        return f"{self.cls.__name__} exception"

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name == "args":
            return trackers.TupleVariable(self.args)
        if name == "__class__":
            return VariableTracker.build_object(tx, self.cls)
        if name == "__cause__":
            return self.cause or ConstantVariable(None)
        if name == "__context__":
            return self.context or ConstantVariable(None)
        if name == "__suppress_context__":
            return ConstantVariable(self.suppress_context)
        if name == "__traceback__":
            raise Unsupported(f"reading the traceback of {self.describe()}")
        found = _class_attr(self.cls, name)
        if found is not _NO_VALUE:
            if isinstance(found, types.FunctionType):
                return trackers.UserMethodVariable(found, self)
            if isinstance(found, property) and isinstance(found.fget, types.FunctionType):
                return _inline(tx, found.fget, [self], {})
            if isinstance(found, (int, float, str, bool, type(None))):
                return ConstantVariable(found)
        if name in ("with_traceback", "add_note", "__str__", "__repr__"):
            return trackers.BoundMethodVariable(self, name)
        if found is _NO_VALUE and not hasattr(self.cls, name):
            msg = f"'{self.cls.__name__}' object has no attribute '{name}'"
            raise TracedException(AttributeError, [ConstantVariable(msg)], msg)
        raise Unsupported(f"reading '{name}' of {self.describe()}")

    def setattr(self, tx, name, value):
        if name == "args":
            self.args = value.unpack(tx)
        elif name == "__cause__":
            self.cause, self.suppress_context = _cause_of(tx, value), True
        elif name == "__context__":
            self.context = _cause_of(tx, value)
        elif name == "__suppress_context__":
            self.suppress_context = bool(value.as_constant())
        elif name.startswith("__") or isinstance(_class_attr(self.cls, name), property):
            raise Unsupported(f"setting '{name}' of {self.describe()}")
        else:
            self.attrs[name] = value
        self._real = None

    def call_method(self, tx, name, args, kwargs):
        if name == "__init__" and not kwargs:  # BaseException.__init__ (via super()): it sets args
            self.args = list(args)
            self._real = None
            return ConstantVariable(None)
        if name == "with_traceback" and len(args) == 1 and args[0].is_constant() and args[0].as_constant() is None:
            return self
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        def build():
            args = "(" + "".join(f"{cg.reconstruct(a)}, " for a in self.args) + ")"
            if not self.attrs and not self.cause and not self.context and is_builtin_exception(self.cls):
                return f"{cg.const(self.cls, self.cls.__name__)}{args}"
            attrs = "{" + "".join(f"{k!r}: {cg.reconstruct(v)}, " for k, v in self.attrs.items()) + "}"
            links = ", ".join(cg.reconstruct(v) if v is not None else "None" for v in (self.cause, self.context))
            return (f"{cg.const(_rebuild, 'rebuild_exception')}({cg.const(self.cls, self.cls.__name__)}, {args}, "
                    f"{attrs}, {links}, {self.suppress_context})")

        return cg.memo(self, build)


def _inline(tx, fn: types.FunctionType, args: list, kwargs: dict):
    fn_vt = trackers.UserFunctionVariable(fn, tx.output.object_source(fn, fn.__qualname__))
    return tx.inline_call(fn_vt, args, kwargs)


def _class_attr(cls, name):
    for klass in cls.__mro__:
        if name in klass.__dict__ and not is_builtin_exception(klass) and klass is not object:
            return klass.__dict__[name]
    return _NO_VALUE


def _cause_of(tx, value):
    if value.is_constant() and value.as_constant() is None:
        return None
    if isinstance(value, ExceptionVariable):
        return value
    if value.is_constant() and is_modelled_exception(value.as_constant()):
        return make_exception(tx, value.as_constant(), [], {})
    raise Unsupported(f"exception cause {value.describe()} (TypeError unless an exception)")


def _rebuild(cls, args, attrs, cause=None, context=None, suppress=False):
    """An exception object with this state, made without running ``__init__`` again (it ran in the
    trace): what ``BaseException.__new__`` plus the traced ``__init__`` left."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(attrs)
    exc.__context__ = context
    exc.__cause__ = cause
    exc.__suppress_context__ = suppress
    return exc


def exception_value(exc: TracedException, tx=None) -> VariableTracker:
    """The tracker of the raised exception object (made on first need, kept by re-raises); ``tx``:
    the frame catching it, whose handled exception is its ``__context__``."""
    if exc.value is None:
        exc.value = ExceptionVariable(exc.exc_type, exc.args_vts)
        if tx is not None:
            set_context(tx, exc.value)
    return exc.value


def to_traced(tx, value: VariableTracker, cause: "VariableTracker | None" = None,
              reraise: bool = False) -> TracedException:
    """``raise value`` (``from cause``): an exception class or object becomes a TracedException
    (others break). The exception being handled becomes its ``__context__``, as CPython does."""
    if value.is_constant() and is_modelled_exception(value.as_constant()):
        value = make_exception(tx, value.as_constant(), [], {})
    if not isinstance(value, ExceptionVariable):
        raise Unsupported(f"raising an exception: {value.describe()}")
    if cause is not None:
        value.cause, value.suppress_context = _cause_of(tx, cause), True
    if not reraise:  # a re-raise (bare ``raise``, a finally block's) keeps the exception as it was
        set_context(tx, value)
    return TracedException(value.cls, value.args, _reason(value.cls), value=value)


def set_context(tx, value: ExceptionVariable) -> None:
    """``__context__`` of an exception raised now: the innermost exception being handled, in this
    frame or a frame that inlined it (a raise of the handled exception itself leaves it)."""
    frame = tx
    while frame is not None:
        stack = getattr(frame, "exc_stack", None)
        if stack:
            handled = stack[-1]
            if handled is not value and isinstance(handled, ExceptionVariable):
                value.context = handled
            return
        frame = getattr(frame, "parent", None)


def _reason(cls) -> str:
    return "raising AssertionError (a failed assert)" if cls is AssertionError else f"raising {cls.__name__}"
