"""Guards: the facts a cache entry relies on, and the generated Python that checks them.

The tracer records ``Guard``s as it wraps inputs (tensor metadata, Python values, identities) and as
it reads global state. ``GuardSet.check_lines`` renders them into the body of the entry function
(see ``codegen.py``); ``explain_failure`` re-checks them one by one to tell users, in plain words,
why a call missed the cache (``x.shape[0] changed: 8 -> 16``).
"""
from __future__ import annotations

import enum
import math
import operator
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ember.frontend.sources import Source


class GuardKind(enum.Enum):
    TENSOR = "tensor type, dtype, device, shape, stride and requires_grad"
    CONST = "Python value"
    ID = "object identity"
    TYPE = "type"
    LEN = "container length"
    DICT_KEYS = "dict keys in order"
    NO_HOOKS = "module has no hooks"
    ALIAS = "two inputs are the same object"
    NOT_ALIAS = "two inputs are different objects"
    GLOBAL_STATE = "grad mode, autocast state and default dtype"
    SHAPE = "relations between symbolic sizes (dynamic shapes)"
    # only where the code reads it (x.storage_offset()): views at any offset share one compile otherwise
    STORAGE_OFFSET = "tensor storage offset"
    # where traced code found an attribute missing (getattr(obj, name, default), hasattr, a __getattr__
    # fallback): setting it later must recompile, not rerun the branch taken without it
    NO_ATTR = "attribute absent from the object and its class"


@dataclass(frozen=True)
class TensorMeta:
    """What a tensor guard checks. With dynamic shapes, ``shape``/``stride`` hold None where the
    position is symbolic: the SHAPE guard checks those (bindings and relations)."""

    cls: type
    dtype: torch.dtype
    device: torch.device
    shape: tuple
    stride: tuple
    requires_grad: bool
    # sparse COO and mkldnn tensors answer stride() too ((0, 0), (1, 0)): without the layout an entry
    # made for an expanded dense tensor took them, and its code failed on them (CSR's stride() raises,
    # so the layout is checked before the strides)
    layout: torch.layout = torch.strided

    @staticmethod
    def of(t: torch.Tensor) -> "TensorMeta":
        return TensorMeta(type(t), t.dtype, t.device, tuple(t.shape), tuple(t.stride()), t.requires_grad, t.layout)


@dataclass(frozen=True)
class KeysBut:
    """A DICT_KEYS expectation that ignores some keys: the locals a loop-body segment receives, less
    the loop variables the body stores before reading them (bound or not at entry, the body runs the
    same: ``resume.dead_on_entry``), so the first iteration and the later ones share one entry."""

    keys: tuple
    ignored: tuple  # (strings: rendered inline)

    def of(self, d) -> tuple:
        return tuple([k for k in d if k not in self.ignored])


class IdentityKeys:
    """A DICT_KEYS expectation for keys that compare by identity (tensors: ``==`` compares their
    elements): the same objects, in the same order. Equal (as a guard's expectation) by the keys' ids."""

    __slots__ = ("keys",)

    def __init__(self, keys: tuple):
        self.keys = keys

    def __eq__(self, other):
        return isinstance(other, IdentityKeys) and len(other.keys) == len(self.keys) and \
            all(a is b for a, b in zip(self.keys, other.keys))

    def __hash__(self):
        return hash(tuple(map(id, self.keys)))

    def matches(self, d) -> bool:
        return len(d) == len(self.keys) and all(map(operator.is_, d, self.keys))

    def __repr__(self):
        return f"IdentityKeys({len(self.keys)} keys)"

    def __reduce__(self):
        # an identity holds in this process only (and the keys are tensors: parameters' data would go
        # to disk): an entry guarded so is not stored by the frontend cache
        raise TypeError("a guard on the identity of dict keys cannot be stored")


def global_state() -> tuple:
    """The ambient state a graph is specialised on. Called by every entry function: keep it cheap."""
    return (
        torch.is_grad_enabled(),
        torch.is_autocast_enabled("cpu"),
        torch.is_autocast_enabled("cuda"),
        torch.get_default_dtype(),
    )


_GLOBAL_STATE_NAMES = ("grad mode", "CPU autocast", "CUDA autocast", "default dtype")

# The global-state guard is checked inline in the entry, not by calling ``global_state()``: no frame
# and no tuple per call, and one C call (``_is_any_autocast_enabled``) stands for both autocast
# reads in the usual case, autocast off everywhere. These names are bound in every entry's namespace.
# (The ``__ember_`` prefix: no name the entry's code generator makes, e.g. ``__default_dtype`` for a
# parameter ``dtype``'s default, can take it.)
GLOBAL_STATE_NS = {"__ember_gs_grad": torch.is_grad_enabled,
                   "__ember_gs_any_autocast": torch._C._is_any_autocast_enabled,
                   "__ember_gs_autocast": torch.is_autocast_enabled,
                   "__ember_gs_default_dtype": torch.get_default_dtype}


def _render_global_state(state: tuple, const) -> list[str]:
    """``global_state() == state`` as conditions on the state's parts (same result, cheaper)."""
    grad, cpu, cuda, dtype = state
    if not cpu and not cuda:  # (autocast may be on for another device type: then ask about these two)
        autocast = ["(not __ember_gs_any_autocast() or not (__ember_gs_autocast('cpu') or __ember_gs_autocast('cuda')))"]
    else:
        autocast = [f"__ember_gs_autocast('cpu') is {bool(cpu)}", f"__ember_gs_autocast('cuda') is {bool(cuda)}"]
    return [f"__ember_gs_grad() is {bool(grad)}", *autocast, f"__ember_gs_default_dtype() is {const(dtype, 'dtype')}"]


@dataclass(frozen=True, eq=False)
class Guard:
    source: Source | None
    kind: GuardKind
    expected: Any = None
    other: Source | None = None  # ALIAS (NOT_ALIAS): the source that must (must not) be the same object

    def key(self):
        exp = self.expected
        if self.kind in (GuardKind.ID,):
            exp = id(exp)
        return (self.source, self.kind, self.other, exp if _hashable(exp) else id(exp))


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


class GuardSet:
    def __init__(self) -> None:
        self._guards: dict = {}

    def add(self, source: Source | None, kind: GuardKind, expected: Any = None, other: Source | None = None) -> None:
        g = Guard(source, kind, expected, other)
        self._guards.setdefault(g.key(), g)

    def __iter__(self):
        return iter(self._guards.values())

    def keep_only(self, kept) -> None:
        """Drop every guard not in ``kept`` (the user's guard_filter_fn decided)."""
        ids = {id(g) for g in kept}
        self._guards = {k: g for k, g in self._guards.items() if id(g) in ids}

    def __len__(self) -> int:
        return len(self._guards)

    # ---- code generation -------------------------------------------------------------------
    def check_lines(self, load: Callable[[Source], str], const: Callable[[Any, str], str], lines: list[str]) -> dict:
        """Append ``if not (<check>): return __MISS`` per guard, in order, to ``lines`` (the list
        ``load`` also appends its temps to, so each guard follows the loads it needs).

        Returns {line index: the check's conjuncts}, so a caller can rebuild a check from a subset
        (``skip_guard_eval_unsafe`` keeps only the conjuncts that tell cache entries apart)."""
        conjuncts = {}
        for g in self:
            if g.kind is GuardKind.SHAPE:  # binds the symbols (plain lines), then checks relations
                conds = g.expected.render(load, lines)
                if conds:
                    conjuncts[len(lines)] = conds
                    lines.append(f"if not ({' and '.join(conds)}):  # symbolic sizes: SHAPE")
                    lines.append("    return __MISS")
                continue
            v = load(g.source) if g.source is not None else None
            conds = _render(g, v, load, const)
            label = g.source.name() if g.source is not None else "global state"
            conjuncts[len(lines)] = conds
            lines.append(f"if not ({' and '.join(conds)}):  # {label}: {g.kind.name}")
            lines.append("    return __MISS")
        return conjuncts


def _render(g: Guard, v: str | None, load, const) -> list[str]:
    """The check as a list of conditions that must all hold (a tensor check has one per property,
    so ``skip_guard_eval_unsafe`` can keep only those that tell cache entries apart)."""
    if g.kind is GuardKind.TENSOR:
        m: TensorMeta = g.expected
        head = [f"type({v}) is {const(m.cls, 'type')}", f"{v}.dtype is {const(m.dtype, 'dtype')}",
                f"{v}.device == {const(m.device, 'dev')}", f"{v}.layout is {const(m.layout, 'layout')}"]
        if None not in m.shape and None not in m.stride:
            sizes = [f"{v}.shape == {m.shape!r}", f"{v}.stride() == {m.stride!r}"]
        else:  # dynamic: the static positions here, the symbolic ones in the SHAPE guard
            sizes = [f"{v}.dim() == {len(m.shape)}"]
            sizes += [f"{v}.size({i}) == {n}" for i, n in enumerate(m.shape) if n is not None]
            sizes += [f"{v}.stride({i}) == {n}" for i, n in enumerate(m.stride) if n is not None]
        return head + sizes + [f"{v}.requires_grad is {m.requires_grad}"]
    if g.kind is GuardKind.GLOBAL_STATE:
        return _render_global_state(g.expected, const)
    return [_render_one(g, v, load, const)]


def _render_one(g: Guard, v: str | None, load, const) -> str:
    k = g.kind
    e = g.expected
    if k is GuardKind.CONST:
        if e is None or isinstance(e, bool):
            return f"{v} is {e!r}"
        if isinstance(e, float) and e != e:
            return f"type({v}) is float and {v} != {v}"
        if type(e) is float and e == 0.0:  # (-0.0 == 0.0, yet 1 / x tells them apart)
            return f"type({v}) is float and {v} == 0.0 and {const(math.copysign, 'copysign')}(1.0, {v}) == {math.copysign(1.0, e)!r}"
        if type(e) in _CONTAINERS:  # (``(2,) == (2.0,)``: equal, yet a graph made for 2 is not the one for 2.0)
            return f"{const(same_value, 'same_value')}({v}, {const(e, 'c')})"
        lit = repr(e) if isinstance(e, (int, float, str, bytes)) and _roundtrips(e) else const(e, "c")
        return f"type({v}) is {const(type(e), 'type')} and {v} == {lit}"
    if k is GuardKind.ID:
        return f"{v} is {const(e, 'obj')}"
    if k is GuardKind.TYPE:
        return f"type({v}) is {const(e, 'type')}"
    if k is GuardKind.LEN:
        return f"len({v}) == {e!r}"
    if k is GuardKind.DICT_KEYS:
        if isinstance(e, KeysBut):
            return f"tuple([k for k in {v} if k not in {e.ignored!r}]) == {const(e.keys, 'keys')}"
        if isinstance(e, IdentityKeys):
            return f"{const(e.matches, 'same_keys')}({v})"
        return f"tuple({v}) == {const(tuple(e), 'keys')}"
    if k is GuardKind.NO_HOOKS:
        return f"not ({v}._forward_hooks or {v}._forward_pre_hooks)"
    if k is GuardKind.ALIAS:
        return f"{v} is {load(g.other)}"
    if k is GuardKind.NOT_ALIAS:
        return f"{v} is not {load(g.other)}"
    if k is GuardKind.STORAGE_OFFSET:
        return f"{v}.storage_offset() == {e!r}"
    if k is GuardKind.NO_ATTR:
        return f"{const(lacks_attr, 'lacks_attr')}({v}, {e!r})"
    raise AssertionError(k)


def _in_mro(mro, name: str):
    for c in mro:
        d = c.__dict__
        if name in d:
            return d[name]
    return _NOT_FOUND


_NOT_FOUND = object()


def lacks_attr(obj, name: str) -> bool:
    """``getattr(obj, name)`` would not find ``name`` by a plain lookup: not in the instance dict, the
    class (for a class: its MRO, then its metaclass), a filled slot, or an nn.Module's parameters,
    buffers and submodules. ``__getattr__`` is not called: the trace followed it as code. (What
    ``inspect.getattr_static`` answers, at a fifth of its cost: this runs at every call.)"""
    if isinstance(obj, type):
        return _in_mro(obj.__mro__, name) is _NOT_FOUND and _in_mro(type(obj).__mro__, name) is _NOT_FOUND
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        d = None
    if d is not None and name in d:
        return False
    static = _in_mro(type(obj).__mro__, name)
    if static is _NOT_FOUND:
        if isinstance(obj, torch.nn.Module):  # kept outside __dict__, reached through Module.__getattr__
            return not any(name in d.get(k, ()) for k in ("_parameters", "_buffers", "_modules"))
        return True
    if type(static) is types.MemberDescriptorType:  # a slot: missing until assigned
        try:
            static.__get__(obj, type(obj))
        except AttributeError:
            return True
    return False


_CONTAINERS = (tuple, list, dict, set, frozenset)


def same_value(v, e) -> bool:
    """``v == e`` with the types equal too, all the way into containers (``(2,) == (2.0,)`` and
    ``{"p": True} == {"p": 1}`` hold, yet each is another constant of the graph), NaN equal to NaN
    and -0.0 not 0.0. What a CONST guard on a container checks (a scalar's is rendered inline)."""
    t = type(v)
    if t is not type(e):
        return False
    if t is tuple or t is list:
        return len(v) == len(e) and all(map(same_value, v, e))
    if t is dict:
        return v.keys() == e.keys() and all(same_value(x, e[k]) for k, x in v.items())
    if t is set or t is frozenset:  # (by type and value: a member's sign of zero is not compared)
        return {(type(x), x) for x in v} == {(type(x), x) for x in e}
    if t is float:
        if e != e:
            return v != v
        return v == e and (e != 0.0 or math.copysign(1.0, v) == math.copysign(1.0, e))
    return v == e


def _roundtrips(x) -> bool:
    """Does ``repr(x)`` read back as ``x``? Exact ints, strings and bytes always do, finite floats too
    (``repr`` is the shortest round-tripping form): answered without ``eval``, which compiled each
    literal (a 24-layer Llama's config guards: ~0.3 s of its cold compile)."""
    t = type(x)
    if t is int or t is str or t is bytes:
        return True
    if t is float:
        return math.isfinite(x)
    try:
        return eval(repr(x)) == x  # noqa: S307 - literals only
    except Exception:
        return False


# ---- failure explanation (cache-miss path only: speed does not matter here) -------------------
def explain_failure(guards: GuardSet, evaluate: Callable[[Source], Any]) -> str | None:
    """The first failing guard in plain words, or None if all hold."""
    for g in guards:
        try:
            if g.kind is GuardKind.GLOBAL_STATE:
                now = global_state()
                for name, old, new in zip(_GLOBAL_STATE_NAMES, g.expected, now):
                    if old != new:
                        return f"{name} changed: {old} -> {new}"
                continue
            if g.kind is GuardKind.SHAPE:
                msg = g.expected.explain(evaluate)
                if msg:
                    return msg
                continue
            val = evaluate(g.source)
        except Exception as exc:  # the path no longer resolves
            return f"{g.source.name()} could not be read ({type(exc).__name__}: {exc})"
        msg = _explain_one(g, val, evaluate)
        if msg:
            return msg
    return None


def _explain_one(g: Guard, val, evaluate) -> str | None:
    n = g.source.name()
    e = g.expected
    k = g.kind
    if k is GuardKind.TENSOR:
        m: TensorMeta = e
        if type(val) is not m.cls:
            return f"{n} type changed: {m.cls.__name__} -> {type(val).__name__}"
        if val.dtype is not m.dtype:
            return f"{n}.dtype changed: {m.dtype} -> {val.dtype}"
        if val.device != m.device:
            return f"{n}.device changed: {m.device} -> {val.device}"
        if val.layout is not m.layout:
            return f"{n}.layout changed: {m.layout} -> {val.layout}"
        if val.dim() != len(m.shape):
            return f"{n}.dim() changed: {len(m.shape)} -> {val.dim()} (shape {list(m.shape)} -> {list(val.shape)})"
        for i, (a, b) in enumerate(zip(m.shape, val.shape)):
            if a is not None and a != b:
                return f"{n}.shape[{i}] changed: {a} -> {b}"
        for i, (a, b) in enumerate(zip(m.stride, val.stride())):
            if a is not None and a != b:
                return f"{n}.stride()[{i}] changed: {a} -> {b}"
        if val.requires_grad != m.requires_grad:
            return f"{n}.requires_grad changed: {m.requires_grad} -> {val.requires_grad}"
        return None
    if k is GuardKind.CONST:
        if type(val) is not type(e):
            return f"{n} type changed: {type(e).__name__} -> {type(val).__name__} (value {val!r})"
        return None if same_value(val, e) else f"{n} changed: {e!r} -> {val!r}"
    if k is GuardKind.ID:
        return None if val is e else f"{n} is a different object now ({_short(e)} -> {_short(val)})"
    if k is GuardKind.TYPE:
        return None if type(val) is e else f"{n} type changed: {e.__name__} -> {type(val).__name__}"
    if k is GuardKind.LEN:
        return None if len(val) == e else f"len({n}) changed: {e} -> {len(val)}"
    if k is GuardKind.DICT_KEYS:
        if isinstance(e, IdentityKeys):
            return None if e.matches(val) else f"{n} keys are not the same objects now"
        if isinstance(e, KeysBut):
            now = e.of(val)
            return None if now == e.keys else f"{n} keys changed: {list(e.keys)} -> {list(now)} (ignoring {list(e.ignored)})"
        return None if tuple(val) == tuple(e) else f"{n} keys changed: {list(e)} -> {list(val)}"
    if k is GuardKind.NO_HOOKS:
        return None if not (val._forward_hooks or val._forward_pre_hooks) else f"{n} has forward hooks now"
    if k is GuardKind.ALIAS:
        other = evaluate(g.other)
        return None if val is other else f"{n} and {g.other.name()} are no longer the same object"
    if k is GuardKind.NOT_ALIAS:
        other = evaluate(g.other)
        return None if val is not other else f"{n} and {g.other.name()} are the same object now"
    if k is GuardKind.STORAGE_OFFSET:
        now = val.storage_offset()
        return None if now == e else f"{n}.storage_offset() changed: {e} -> {now}"
    if k is GuardKind.NO_ATTR:
        return None if lacks_attr(val, e) else f"{n}.{e} was missing and is set now"
    raise AssertionError(k)


def _short(obj) -> str:
    r = repr(obj)
    return r if len(r) <= 60 else r[:57] + "..."
