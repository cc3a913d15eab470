"""Exception objects the traced program makes or raises (``KeyError('k')``, ``raise ValueError(...)``).

Only builtin exception types are modelled: their constructors just keep the arguments. The
interpreter catches a ``TracedException`` in traced ``try`` blocks (interpreter.py, handlers/blocks.py).
"""
from __future__ import annotations

import builtins

from ember.frontend.errors import TracedException, Unsupported
from ember.frontend.variables.base import ConstantVariable, VariableTracker, helpers, trackers


@helpers.add
def is_builtin_exception(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, BaseException) and getattr(builtins, cls.__name__, None) is cls


class ExceptionVariable(VariableTracker):
    def __init__(self, cls: type, args: list):
        self.cls = cls
        self.args = list(args)

    def python_type(self):
        return self.cls

    def is_constant(self):
        return all(a.is_constant() for a in self.args)

    def as_constant(self):
        """The real exception (one object per tracker, so ``is`` holds): str(), repr() and
        comparisons of it fold."""
        if getattr(self, "_real", None) is None:
            self._real = self.cls(*[a.as_constant() for a in self.args])
        return self._real

    def describe(self):
        return f"{self.cls.__name__} exception"

    def getattr(self, tx, name):
        if name == "args":
            return trackers.TupleVariable(self.args)
        if name == "__class__":
            return VariableTracker.build_object(tx, self.cls)
        if name in ("__cause__", "__context__", "__traceback__"):
            return ConstantVariable(None)
        raise Unsupported(f"reading '{name}' of {self.describe()}")

    def reconstruct(self, cg):
        return cg.memo(self, lambda: f"{cg.const(self.cls, self.cls.__name__)}("
                       + "".join(f"{cg.reconstruct(a)}, " for a in self.args) + ")")


def exception_value(exc: TracedException) -> VariableTracker:
    """The tracker of the raised exception object (made on first need, kept by re-raises)."""
    if exc.value is None:
        exc.value = ExceptionVariable(exc.exc_type, exc.args_vts)
    return exc.value


def to_traced(tx, value: VariableTracker) -> TracedException:
    """``raise value``: an exception class or object becomes a TracedException (others break)."""
    if isinstance(value, ExceptionVariable):
        return TracedException(value.cls, value.args, _reason(value.cls), value=value)
    if value.is_constant() and is_builtin_exception(value.as_constant()):
        cls = value.as_constant()
        return TracedException(cls, [], _reason(cls))
    raise Unsupported(f"raising an exception: {value.describe()}")


def _reason(cls) -> str:
    return "raising AssertionError (a failed assert)" if cls is AssertionError else f"raising {cls.__name__}"
