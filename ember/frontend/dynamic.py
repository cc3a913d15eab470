"""Dynamic shapes: which input dimensions are traced as symbols, and the guards on those symbols.

torch.compile's policy, reproduced:

* ``dynamic=None`` (default): the first compile is static. When a later call misses the cache because
  a tensor's size changed, the dimensions that changed become symbolic and the frame compiles once
  for all their sizes ("automatic dynamic"). Python ints that change value likewise.
  ``ember.config.automatic_dynamic = False`` turns this off (one compile per size).
* ``dynamic=True``: every dimension of every input tensor (and every int argument) starts symbolic;
  ``dynamic=False``: nothing becomes symbolic on its own.
* ``ember.mark_dynamic(t, dim, min=, max=)`` / ``maybe_mark_dynamic`` / ``mark_static`` mark one tensor's
  dimensions, whatever the policy. Parameters and module buffers always stay static.
* Sizes 0 and 1 stay specialized (the ShapeEnv does that), so broadcasting stays decidable.
  One exception, so that a batch sweep starting at 1 costs one recompile, not two: a dimension that
  had size 1 at an earlier compile and now becomes a symbol is traced *size-obliviously* (torch's
  ``backed_size_oblivious``): its symbol's range is ``[1, inf)``, and the library code that asks "is
  this size 1?" through ``guard_or_false`` takes the general branch without a guard (torch writes
  those sites so that the general branch is right for 1 too, or checks with ``torch._check``, which
  *is* a guard). A program that branches on the size being 1 itself (``if x.size(0) == 1``, a
  broadcast that only works at 1) still records ``Ne(s0, 1)`` or ``Eq(s0, s1)``, and the guard
  rejects size 1 there: never a wrong result, at worst the old extra compile.

The symbols live in a ``ShapeEnv`` shared by the frame's ``FakeTensorMode``. Tracing records what the
program assumed of them (``s0 >= 2``, ``s0 == s1``, ``s1 % 8 == 0``); ``ShapeGuardPlan`` renders those
assumptions into the generated entry function and explains, on a miss, which relation failed.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import sympy
import torch
from torch._guards import GuardSource
from torch._guards import Source as _TorchSource
from torch.fx.experimental import _config as _fx_config
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.utils._sympy.printers import PythonPrinter

from ember.config import config
from ember.frontend.sources import AttrSource, ItemSource, LocalSource, ModuleSlotSource, Source

# attribute names on user tensors (public API: ember.mark_dynamic & co.)
_DYN_ATTR = "_ember_dynamic_dims"      # {dim: (min, max)}: must be symbolic
_MAYBE_ATTR = "_ember_maybe_dynamic_dims"  # {dim}: symbolic unless the program specializes it
_STATIC_ATTR = "_ember_static_dims"    # {dim}: never symbolic


def mark_dynamic(t: torch.Tensor, dim, min: int | None = None, max: int | None = None) -> None:
    """Trace dimension ``dim`` (an int or a list of ints) of ``t`` as a symbol from the first compile.

    Compiling raises ``ConstraintViolation`` if the program only works for one size of that dimension
    (or for a narrower range than ``[min, max]``); a later call whose size is outside ``[min, max]``
    misses the cache and recompiles."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"mark_dynamic expects a tensor, got {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    marks = dict(getattr(t, _DYN_ATTR, {}))
    for d in dims:
        d = _check_dim(t, d, "mark_dynamic")
        if min is not None and max is not None and min > max:
            raise ValueError(f"mark_dynamic: min={min} is larger than max={max}")
        if (min is not None and t.shape[d] < min) or (max is not None and t.shape[d] > max):
            raise ValueError(f"mark_dynamic: dimension {d} has size {t.shape[d]}, outside the given "
                             f"bounds [{min}, {max}]")
        marks[d] = (min, max)
    setattr(t, _DYN_ATTR, marks)


def maybe_mark_dynamic(t: torch.Tensor, dim) -> None:
    """Like ``mark_dynamic`` but without the error: if the program specializes the dimension, it is
    simply traced static."""
    dims = [dim] if isinstance(dim, int) else list(dim)
    setattr(t, _MAYBE_ATTR, set(getattr(t, _MAYBE_ATTR, set())) | {_check_dim(t, d, "maybe_mark_dynamic") for d in dims})


def mark_static(t: torch.Tensor, dim=None) -> None:
    """Never trace dimension ``dim`` (default: every dimension) of ``t`` as a symbol."""
    dims = range(t.dim()) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    setattr(t, _STATIC_ATTR, set(getattr(t, _STATIC_ATTR, set())) | {_check_dim(t, d, "mark_static") for d in dims})


def _check_dim(t, d: int, what: str) -> int:
    if not -t.dim() <= d < max(t.dim(), 1):
        raise IndexError(f"{what}: dimension {d} out of range for a {t.dim()}-d tensor")
    return d % t.dim() if t.dim() else 0


class ConstraintViolation(RuntimeError):
    """A dimension marked dynamic was specialized (or narrowed) by the traced program."""


# --------------------------------------------------------------------------------------------------
# the policy and the frame's memory of earlier sizes

class FrameShapeState:
    """Per compiled callable: the sizes each input had at earlier compiles (None where a dimension
    was already seen to change), so a recompile knows which dimensions to make symbolic."""

    def __init__(self, dynamic: bool | None):
        self.dynamic = dynamic
        self.sizes: dict[str, tuple] = {}   # source name -> sizes, None = changed before
        self.ints: dict[str, Any] = {}      # source name -> value, None = changed before
        self.ones: dict[str, set] = {}      # source name -> dimensions that had size 1 at a compile

    def tensor_dims(self, name: str, value: torch.Tensor, static_source: bool) -> dict[int, tuple | None]:
        """{dim: (min, max) or None} of the dimensions to trace as symbols; records the sizes."""
        shape = tuple(value.shape)
        marked = dict(getattr(value, _DYN_ATTR, {}))
        maybe = set(getattr(value, _MAYBE_ATTR, set()))
        static = set(getattr(value, _STATIC_ATTR, set()))
        dims: dict[int, tuple | None] = {d: b for d, b in marked.items()}
        dims.update({d: None for d in maybe if d not in dims})
        before = self.sizes.get(name)
        if before is not None and len(before) == len(shape):
            merged = tuple(None if (b is None or b != s) else s for b, s in zip(before, shape))
        else:
            merged = shape
        self.sizes[name] = merged
        ones = self.ones.setdefault(name, set())
        ones.update(d for d, s in enumerate(shape) if s == 1)
        if not static_source:
            if self.dynamic is True:
                dims.update({d: None for d in range(len(shape)) if d not in dims})
            elif self.dynamic is None and config.automatic_dynamic:
                dims.update({d: None for d, s in enumerate(merged) if s is None and d not in dims})
        for d in static:
            if d in marked:
                raise ValueError(f"dimension {d} of {name} is marked both dynamic and static")
            dims.pop(d, None)
        return dims

    def oblivious_dims(self, name: str, value: torch.Tensor, dims: dict) -> set[int]:
        """Of the symbolic ``dims`` (from ``tensor_dims``), those to trace size-obliviously: size 1 at an
        earlier compile, 2 or more now, and not given bounds by ``mark_dynamic`` (whose ranges keep
        their documented meaning). Empty when ``config.size_oblivious_ones`` is off."""
        if not config.size_oblivious_ones:
            return set()
        ones = self.ones.get(name, ())
        marked = getattr(value, _DYN_ATTR, {})
        return {d for d in dims if d in ones and d not in marked and value.shape[d] >= 2}

    def scalar_changed(self, name: str, value) -> bool:
        """Has this Python number (read by a loop body that runs as compiled segments) had another
        value at an earlier compile? Recorded on the way."""
        scalars = self.__dict__.setdefault("scalars", {})
        before = scalars.get(name, value)
        changed = before is None or before != value or type(before) is not type(value)
        scalars[name] = None if changed else value
        return changed

    def int_dynamic(self, name: str, value: int) -> bool:
        before = self.ints.get(name, value)
        changed = before is None or before != value
        self.ints[name] = None if changed else value
        return self.dynamic is True or (self.dynamic is None and changed and config.automatic_dynamic)


def is_static_source(source: Source, value) -> bool:
    """Parameters and everything reached through an attribute (module buffers, config tensors) keep
    static shapes, as in torch.compile: their sizes do not change between calls."""
    if isinstance(value, torch.nn.Parameter):
        return True
    s = source
    while s is not None:
        if isinstance(s, (AttrSource, ModuleSlotSource)):
            return True
        s = s.base()
    return False


def is_argument_source(source: Source) -> bool:
    """An int reached from the call's arguments (``n``, ``args[1]``, ``kw['n']``): a candidate for a
    symbolic int. Globals, closures and attributes stay constants."""
    s = source
    while isinstance(s, ItemSource):
        s = s.base()
    return isinstance(s, LocalSource)


# --------------------------------------------------------------------------------------------------
# symbols

@dataclasses.dataclass(frozen=True)
class _DimSource(_TorchSource):
    """How ShapeEnv names the origin of a symbol (it only reads the name, for its own messages)."""

    label: str = ""

    @property
    def _name_template(self) -> str:
        return self.label

    @property
    def guard_source(self):  # noqa: D401 - the ShapeEnv asks; these are all call arguments
        return GuardSource.LOCAL

    if not isinstance(inspect.getattr_static(_TorchSource, "name"), (property, functools.cached_property)):
        def name(self) -> str:  # older torch: a method
            return self.label


def new_shape_env() -> ShapeEnv:
    # no unbacked symbols: data-dependent ops (nonzero, item) stay graph breaks, as with static shapes
    return ShapeEnv(allow_scalar_outputs=False, allow_dynamic_output_shape_ops=False)


def size_oblivious():
    """torch's switch for size-oblivious tracing of backed symbols (read by ``create_symbol`` and by
    ``guard_or_false``/``guard_or_true``); a global, so it is on only while one frame is traced and
    compiled (``OutputGraph.scope``)."""
    return _fx_config.patch(backed_size_oblivious=True)


def symbolic_context(ndim: int, dims: dict) -> StatelessSymbolicContext:
    sizes = [DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(ndim)]
    return StatelessSymbolicContext(dynamic_sizes=sizes)


def dim_source(label: str) -> _DimSource:
    return _DimSource(label=label)


def free_symbols(value) -> set:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return set(value.node.expr.free_symbols)
    if isinstance(value, sympy.Expr):
        return set(value.free_symbols)
    return set()


def is_symbolic(value) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) and bool(free_symbols(value))


def py_name(sym: sympy.Symbol) -> str:
    return f"__sym_{sym.name}"


class _Printer(PythonPrinter):
    """Symbols print as the entry's locals (``__sym_s0``), or as the user's names when given labels."""

    def __init__(self, labels: dict | None = None):
        super().__init__()
        self.labels = labels

    def _print_Symbol(self, expr) -> str:
        return self.labels.get(expr.name, expr.name) if self.labels is not None else py_name(expr)


_PRINTER = _Printer()


def render_expr(expr) -> str:
    """Python text of a size expression over the entry's symbol locals (``__sym_s0 * 4``)."""
    return _PRINTER.doprint(sympy.sympify(expr))


# --------------------------------------------------------------------------------------------------
# guards

@dataclasses.dataclass
class Binding:
    """``__sym_sN = <source>.size(dim)`` (kind "size"/"stride") or ``= <source>`` (kind "int")."""

    source: Source
    kind: str
    dim: int
    symbol: sympy.Symbol

    def load(self, v: str) -> str:
        return v if self.kind == "int" else f"{v}.{self.kind}({self.dim})"

    def label(self) -> str:
        return self.source.name() if self.kind == "int" else f"{self.source.name()}.{self.kind}({self.dim})"


@dataclasses.dataclass
class Check:
    """One condition of the shape guard: Python text over the symbol locals, and the same in the
    user's names. A *tie* compares one input position (``y.size(0)``) with an expression."""

    text: str
    readable: str
    tie: tuple | None = None  # (source, "size"/"stride", dim)

    def code(self, load) -> str:
        if self.tie is None:
            return self.text
        source, kind, dim = self.tie
        return f"{load(source)}.{kind}({dim}) == {self.text}"


class ShapeGuardPlan:
    """The symbols of one cache entry, where each one is read from, and what tracing assumed of them.

    Built after the backend compiled the graph (a backend tracing the graph may add assumptions)."""

    def __init__(self, env: ShapeEnv, bindings: list[Binding], ties: list[tuple[Source, str, int, Any]],
                 bounds: dict):
        self.bindings = bindings
        self.checks: list[Check] = []
        labels = {b.symbol: b.label() for b in bindings}
        bound = set(labels)

        printer = _Printer({s.name: label for s, label in labels.items()})

        def readable(expr) -> str:
            return printer.doprint(sympy.sympify(expr))

        # positions whose size is an expression of symbols (a symbol bound elsewhere, s0*s1, ...)
        for source, kind, dim, expr in ties:
            label = Binding(source, kind, dim, sympy.Symbol("_")).label()
            self.checks.append(Check(render_expr(expr), f"{label} == {readable(expr)}", (source, kind, dim)))
        # ranges: sizes 0 and 1 were specialized away, so each symbol assumes >= 2 (or more)
        for sym in sorted(bound, key=lambda s: s.name):
            rng = env.var_to_range.get(sym)
            lo = _finite(rng.lower) if rng is not None else None
            hi = _finite(rng.upper) if rng is not None else None
            user_lo, user_hi = bounds.get(sym, (None, None))
            if user_lo is not None:
                lo = user_lo if lo is None else max(lo, user_lo)
            if user_hi is not None:
                hi = user_hi if hi is None else min(hi, user_hi)
            if lo is not None:
                self.checks.append(Check(f"{py_name(sym)} >= {lo}", f"{labels[sym]} >= {lo}"))
            if hi is not None:
                self.checks.append(Check(f"{py_name(sym)} <= {hi}", f"{labels[sym]} <= {hi}"))
        for g in env.guards:
            expr = g.expr
            if expr == sympy.true or not expr.free_symbols <= bound:
                continue  # trivially true, or about an intermediate value the inputs' symbols imply
            self.checks.append(Check(render_expr(expr), readable(expr)))

    def render(self, load, lines: list[str]) -> list[str]:
        """Append the symbol bindings to ``lines``; return the conditions (Python text)."""
        for b in self.bindings:
            lines.append(f"{py_name(b.symbol)} = {b.load(load(b.source))}  # {b.label()}")
        return [c.code(load) for c in self.checks]

    def explain(self, evaluate) -> str | None:
        """The first relation that does not hold for the values ``evaluate`` reads, in user words."""
        env: dict[str, Any] = {}
        for b in self.bindings:
            v = evaluate(b.source)
            env[py_name(b.symbol)] = v if b.kind == "int" else getattr(v, b.kind)(b.dim)
        values = {}
        for k, c in enumerate(self.checks):
            if c.tie is not None:
                env[f"__tie{k}"] = evaluate(c.tie[0])
            code = c.code(lambda src, k=k: f"__tie{k}")
            try:
                ok = eval(code, dict(SHAPE_GUARD_GLOBALS), env)  # noqa: S307 - our own rendered text
            except Exception as exc:  # noqa: BLE001
                return f"shape relation {c.readable} could not be checked ({type(exc).__name__})"
            if not ok:
                for b in self.bindings:
                    if py_name(b.symbol) in code:
                        values[b.label()] = env[py_name(b.symbol)]
                if c.tie is not None:
                    source, kind, dim = c.tie
                    values[f"{source.name()}.{kind}({dim})"] = getattr(env[f"__tie{k}"], kind)(dim)
                now = ", ".join(f"{n} = {v}" for n, v in values.items())
                return f"shape relation {c.readable} no longer holds ({now})" if now else \
                    f"shape relation {c.readable} no longer holds"
        return None


def _finite(bound) -> int | None:
    """A range bound as an int; None for the infinities (torch's int_oo or sympy's oo)."""
    return int(bound) if isinstance(bound, (int, sympy.Integer)) else None


# names the rendered expressions may use (PythonPrinter prints some functions as math.*)
SHAPE_GUARD_GLOBALS: dict = {"math": __import__("math"), "torch": torch}
