"""Public controls over compilation, named and behaving as in ``torch.compiler``:
``set_stance``, ``disable``, ``reset``, ``allow_in_graph``, ``substitute_in_graph``,
``is_compiling``, ``is_exporting``.

The tracer learns about these through ``trace_rules`` tables (allowed functions, polyfills,
forbidden and disabled callables); nothing here imports the interpreter.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable

import torch

from ember.frontend import stance as _stance
from ember.frontend import trace_rules


# ---- stance -----------------------------------------------------------------------------------
class set_stance:
    """Set how compiled callables behave; a function, a context manager and a decorator.

    ``stance``: "default", "force_eager" (run the original code), "eager_on_recompile" (use cached
    code whose guards pass, otherwise run eagerly; never compile), "fail_on_recompile" (raise instead
    of compiling), "eager_then_compile" (first call eager). ``skip_guard_eval_unsafe=True`` checks
    only the guards that tell cache entries apart (unsafe: a call unlike any seen may run wrong code).
    ``force_backend`` (default stance only) compiles with that backend instead of each callable's own.

    Called inside a compiled function it raises, as torch.compiler.set_stance does.
    """

    _ember_forbidden = "ember.set_stance() cannot be called inside a compiled function"

    def __init__(self, stance: str = "default", *, skip_guard_eval_unsafe: bool = False,
                 force_backend: str | Callable | None = None):
        if stance not in _stance.STANCES:
            raise ValueError(f"unknown stance {stance!r}; valid stances: "
                             + "; ".join(f"{k!r} ({v})" for k, v in _stance.STANCES.items()))
        if force_backend is not None and stance != "default":
            raise RuntimeError("non-default stance cannot have force_backend set: use "
                               f"set_stance('default', force_backend=...) (got stance {stance!r})")
        if force_backend is not None:
            from ember.backends.registry import backend_spec

            backend_spec(force_backend)  # an unknown name fails here, not at the next compile
        self.stance = _stance.Stance(stance, bool(skip_guard_eval_unsafe), force_backend)
        self.prev = _stance.set_current(self.stance)  # as a plain call it takes effect at once

    def __enter__(self):
        _stance.set_current(self.stance)
        return self

    def __exit__(self, *exc):
        _stance.set_current(self.prev)
        return False

    def __call__(self, fn: Callable) -> Callable:
        # used as a decorator: the stance applies only while fn runs
        _stance.set_current(self.prev)
        stance = self.stance

        @functools.wraps(fn)
        def with_stance(*args, **kwargs):
            prior = _stance.set_current(stance)
            try:
                return fn(*args, **kwargs)
            finally:
                _stance.set_current(prior)

        with_stance._ember_forbidden = self._ember_forbidden
        return with_stance


# ---- disable -----------------------------------------------------------------------------------
def disable(fn: Callable | None = None, recursive: bool = True, *, reason: str | None = None):
    """Never compile ``fn``. Compiled code that calls it runs it as plain Python (a graph break).

    ``recursive=True`` (default): ember-compiled callables that ``fn`` calls run eagerly too.
    ``recursive=False``: only ``fn`` itself is skipped; compiled callables inside it still compile.
    Usable as ``@ember.disable``, ``@ember.disable(recursive=False)`` and ``ember.disable(fn)``.
    """
    if fn is None:
        return functools.partial(disable, recursive=recursive, reason=reason)
    if isinstance(fn, torch.nn.Module):
        fn.forward = disable(fn.forward, recursive, reason=reason)
        return fn
    orig = getattr(fn, "_orig_fn", None) or getattr(fn, "_orig_mod", None) or fn  # unwrap ember.compile
    why = reason or f"{getattr(orig, '__qualname__', orig)!s} is marked with ember.disable"
    if not recursive:
        trace_rules.mark_disabled(orig, why)
        return orig

    @functools.wraps(orig)
    def disabled(*args, **kwargs):
        _stance.enter_disabled()  # for this thread only (see frontend/stance.py)
        try:
            return orig(*args, **kwargs)
        finally:
            _stance.exit_disabled()

    trace_rules.mark_disabled(disabled, why)
    return disabled


# ---- caches ------------------------------------------------------------------------------------
def reset() -> None:
    """Forget every compiled entry of every compiled callable: the next calls compile afresh."""
    from ember.backends import regional
    from ember.frontend.cache import ALL_CACHES

    for cache in list(ALL_CACHES):
        cache.reset()
    regional.clear()  # the compiled blocks shared across graphs


# ---- what the tracer may do ----------------------------------------------------------------------
def allow_in_graph(fn):
    """Put calls to ``fn`` into the graph as one opaque node instead of tracing its body.

    ``fn`` must be a function of tensors (and constants) returning tensors, without side effects
    the graph would lose; it is run on fake tensors to learn output shapes. Its node stays in the
    graph even when its result is unused (backend="eager" runs it at every call, as torch.compile
    does); a backend that traces through it (the default) keeps only its tensor operations.
    Accepts a list too.
    """
    if isinstance(fn, (list, tuple)):
        return [allow_in_graph(f) for f in fn]
    if not callable(fn):
        raise TypeError(f"allow_in_graph expects a callable, got {type(fn).__name__}")
    trace_rules.allow_in_graph(fn)
    return fn


def substitute_in_graph(original: Callable, *, can_constant_fold_through: bool = False,
                        skip_signature_check: bool = False) -> Callable[[Callable], Callable]:
    """Register a Python polyfill that ember traces wherever it meets ``original`` (usually a C
    function it cannot see into). The decorated function must have ``original``'s signature.

    With ``can_constant_fold_through=True``, a call whose arguments are all constants calls
    ``original`` itself while tracing and uses its result as a constant. The decorator returns a
    function that calls ``original`` (so eager behaviour is unchanged).
    """
    if not callable(original):
        raise TypeError(f"substitute_in_graph expects the original callable, got {type(original).__name__}")
    if trace_rules.polyfill_of(original) is not None:
        raise ValueError(f"{_qualname(original)} already has a polyfill registered with substitute_in_graph")

    def register(polyfill: Callable) -> Callable:
        if not inspect.isfunction(polyfill):
            raise TypeError(f"the polyfill for {_qualname(original)} must be a Python function, "
                            f"got {type(polyfill).__name__}")
        if not skip_signature_check:
            _check_signature(original, polyfill)
        trace_rules.register_polyfill(original, polyfill, can_constant_fold_through)

        @functools.wraps(polyfill)
        def calls_original(*args, **kwargs):
            return original(*args, **kwargs)

        calls_original.__ember_original__ = original
        calls_original.__ember_polyfill__ = polyfill
        return calls_original

    return register


def _qualname(fn) -> str:
    mod = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    return f"{mod}.{name}" if mod else name


def _sig_key(sig: inspect.Signature):
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def _check_signature(original, polyfill) -> None:
    try:
        want = inspect.signature(original)
    except (TypeError, ValueError):
        return  # C functions without __text_signature__: nothing to compare against
    got = inspect.signature(polyfill)
    if _sig_key(want) != _sig_key(got):
        raise TypeError(f"signature mismatch between {_qualname(original)}{want} and its polyfill "
                        f"{polyfill.__qualname__}{got}: give the polyfill the same parameters (names, kinds "
                        "and defaults), or pass skip_signature_check=True")


def is_compiling() -> bool:
    """True inside code ember is tracing (the tracer answers it), False when running eagerly."""
    return False


_EXPORTING = [0]  # depth of ember.export.export calls in progress (ember/export/capture.py)


@contextlib.contextmanager
def exporting():
    """Mark an ``ember.export.export`` in progress: ``is_exporting()`` answers True inside it, both
    eagerly and in the code the tracer captures."""
    _EXPORTING[0] += 1
    try:
        yield
    finally:
        _EXPORTING[0] -= 1


def is_exporting() -> bool:
    """True while ``ember.export.export`` captures a program (as ``torch.compiler.is_exporting``)."""
    return _EXPORTING[0] > 0


def _exporting_rule(value, source):
    """The tracer's answer to ``is_exporting()``: whether an export is capturing right now (a graph
    captured by ``ember.compile`` is never reused by an export, nor the other way round)."""
    return trace_rules.constant_result(_EXPORTING[0] > 0)(value, source)


trace_rules.register_special(is_compiling, trace_rules.constant_result(True))
trace_rules.register_special(is_exporting, _exporting_rule)
trace_rules.register_special(torch.compiler.is_exporting, _exporting_rule)
trace_rules.forbid(set_stance, set_stance._ember_forbidden)
trace_rules.forbid(torch.compiler.set_stance,
                   "torch.compiler.set_stance() cannot be called inside a compiled function")
