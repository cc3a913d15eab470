"""The VariableTracker protocol, plus the two trivial kinds: constants and the 3.11+ NULL."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.frontend.errors import Unsupported

if TYPE_CHECKING:
    from ember.frontend.interpreter import InstructionTranslator
    from ember.frontend.sources import Source


class VariableTracker:
    """A symbolic Python value. ``source`` says where the real value lives at run time (None when
    the value was made during tracing)."""

    source: "Source | None" = None
    # The attribute holding the real Python object this tracker stands for (an input, a global, a
    # class...), which then decides ``is`` and identity hashing. None: the tracker *is* the object
    # (made in the trace: a new list, user object, tuple, partial...), so identity is the tracker's.
    identity_attr: "str | None" = None

    def python_type(self) -> type:
        raise Unsupported(f"the type of {self.describe()} is not known while tracing")

    def describe(self) -> str:
        return type(self).__name__

    # -- constants --
    def is_constant(self) -> bool:
        return False

    def as_constant(self) -> Any:
        raise Unsupported(f"{self.describe()} is not a Python constant here")

    def is_symbolic(self) -> bool:
        """Holds a symbolic size somewhere (dynamic shapes): its constant value would specialize it."""
        return False

    # -- as an argument of a graph operation --
    def as_node_arg(self) -> Any:
        if self.is_constant():
            return self.as_constant()
        raise Unsupported(f"passing {self.describe()} to a torch operation")

    def as_fake_arg(self) -> Any:
        return self.as_node_arg()

    # -- protocol --
    def getattr(self, tx: "InstructionTranslator", name: str) -> "VariableTracker":
        raise Unsupported(f"reading attribute '{name}' of {self.describe()}")

    def setattr(self, tx: "InstructionTranslator", name: str, value: "VariableTracker") -> None:
        raise Unsupported(f"setting attribute '{name}' of {self.describe()} (side effects are not supported yet)")

    def delattr(self, tx: "InstructionTranslator", name: str) -> None:
        raise Unsupported(f"deleting attribute '{name}' of {self.describe()}")

    def call(self, tx, args: list, kwargs: dict) -> "VariableTracker":
        raise Unsupported(f"calling {self.describe()}")

    def call_method(self, tx, name: str, args: list, kwargs: dict) -> "VariableTracker":
        return self.getattr(tx, name).call(tx, args, kwargs)

    def unpack(self, tx) -> list:
        raise Unsupported(f"iterating over {self.describe()}")

    def iter(self, tx) -> "VariableTracker":
        from ember.frontend.variables.containers import ListIteratorVariable

        return ListIteratorVariable(list(self.unpack(tx)))

    def length(self, tx) -> int:
        return len(self.unpack(tx))

    def truth(self, tx) -> bool:
        raise Unsupported(f"the truth value of {self.describe()}")

    def reconstruct(self, cg) -> str:
        """A Python expression (in the entry function) that produces this value at run time."""
        if self.source is not None:
            return cg.load(self.source)
        raise Unsupported(f"returning {self.describe()} from a compiled function")

    def __repr__(self) -> str:
        return self.describe()


def identity_of(vt: VariableTracker):
    """What ``is`` compares for ``vt``: the real object it stands for, or the tracker itself for an
    object made in the trace (two fresh objects are never identical, whatever their class)."""
    if vt.identity_attr is None:
        return vt
    obj = getattr(vt, vt.identity_attr, None)
    if obj is None and not isinstance(vt, ConstantVariable):  # e.g. a ModelOutput made in the trace
        return vt
    return obj


class NullVariable(VariableTracker):
    """The NULL that 3.11+ pushes below a callable."""

    def describe(self) -> str:
        return "NULL"


NULL = NullVariable()

_LITERAL = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), type(NotImplemented))


class ConstantVariable(VariableTracker):
    """An immutable Python value known while tracing (specialised on, guarded when it has a source)."""

    identity_attr = "value"

    def __init__(self, value: Any, source: "Source | None" = None):
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        r = repr(self.value)
        return f"constant {r if len(r) < 50 else r[:47] + '...'}"

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def truth(self, tx) -> bool:
        return bool(self.value)

    def unpack(self, tx) -> list:
        try:
            items = list(self.value)
        except TypeError:
            raise Unsupported(f"iterating over {self.describe()}") from None
        return [ConstantVariable(v) for v in items]

    def length(self, tx) -> int:
        return len(self.value)

    def getattr(self, tx, name: str) -> VariableTracker:
        from ember.frontend.variables.builder import wrap_const

        try:
            attr = getattr(self.value, name)
        except AttributeError:
            raise
        if callable(attr) and not isinstance(attr, type):
            from ember.frontend.variables.functions import ConstantMethodVariable

            return ConstantMethodVariable(self.value, name)
        return wrap_const(attr)

    def reconstruct(self, cg) -> str:
        if self.source is not None and not isinstance(self.value, _LITERAL):
            return cg.load(self.source)
        return cg.const(self.value)
