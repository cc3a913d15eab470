"""Backends by name. A backend is ``fn(gm: torch.fx.GraphModule, example_inputs: list) -> callable``,
the contract torch.compile backends use, so either side's backends plug into the other.

Names resolve in this order: backends registered in this process (ember's own and
``register_backend`` calls), then the ``ember_backends`` entry-point group (backends shipped by other
packages for ember), then the ``torch_dynamo_backends`` group (backends written for torch.compile).

A backend may declare the ``options`` it understands: a ``BackendOptions`` dataclass (ember's own
backends: ``ember/backends/options.py``) or ``{name: OptionSpec}``; ``ember.compile`` then rejects
unknown keys by name and wrong types by field. A backend that declares nothing receives options unchecked,
as torch.compile passes them (``backend(gm, inputs, options=...)``).
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
from importlib import metadata
from typing import Any, Callable

from ember.backends.options import BackendOptions, type_error, type_ok, unknown_options_error

EMBER_ENTRY_POINTS = "ember_backends"
TORCH_ENTRY_POINTS = "torch_dynamo_backends"


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    type: type
    default: Any
    doc: str = ""


@dataclasses.dataclass
class BackendSpec:
    name: str
    fn: Callable
    tags: tuple = ()
    # {key: OptionSpec}, a BackendOptions class, or an object with validate(options) -> options; None: not declared
    options: dict | type | object | None = None
    origin: str = "registered"   # "registered" | entry-point group name

    def accepts(self, kwarg: str) -> bool:
        try:
            params = inspect.signature(self.fn).parameters.values()
        except (TypeError, ValueError):
            return True
        return any(p.name == kwarg or p.kind is p.VAR_KEYWORD for p in params)


_BACKENDS: dict[str, BackendSpec] = {}
_ALIASES: dict[str, str] = {}
_discovered = False


def register_backend(compiler_fn: Callable | None = None, name: str | None = None, tags: tuple = (),
                     options: dict | None = None):
    """Register a backend; usable as ``@register_backend`` or ``@register_backend(name=..., tags=...)``.

    ``options`` (optional) declares the option keys the backend understands: a ``BackendOptions``
    dataclass or ``{key: OptionSpec}``.
    """
    def deco(fn):
        if not callable(fn):
            raise TypeError(f"register_backend expects a callable fn(gm, example_inputs), got {type(fn).__name__}")
        key = name or fn.__name__
        _BACKENDS[key] = BackendSpec(key, fn, tuple(tags), options)
        return fn

    if compiler_fn is not None:
        return deco(compiler_fn)
    return deco


def register_alias(alias: str, target: str) -> None:
    """``alias`` names the same backend as ``target`` (``inductor`` -> ``ember``)."""
    _ALIASES[alias] = target


def _discover() -> None:
    """Load entry-point backends once; names registered in-process win over discovered ones."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for group in (EMBER_ENTRY_POINTS, TORCH_ENTRY_POINTS):
        try:
            eps = metadata.entry_points(group=group)
        except Exception:  # a broken distribution must not break ember
            continue
        for ep in eps:
            if ep.name in _BACKENDS or ep.name in _ALIASES:
                continue
            if group == TORCH_ENTRY_POINTS and ep.value.startswith("ember."):
                continue  # our own offer to torch.compile: already registered under that name
            _BACKENDS[ep.name] = BackendSpec(ep.name, _LazyEntryPoint(ep), (), None, group)


class _LazyEntryPoint:
    """Imports the entry point's module on first use, so listing backends stays cheap."""

    def __init__(self, ep):
        self.ep = ep
        self._fn = None

    def __call__(self, *args, **kwargs):
        if self._fn is None:
            self._fn = self.ep.load()
        return self._fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<backend {self.ep.name} from {self.ep.value} ({self.ep.group})>"


def backend_spec(backend) -> BackendSpec:
    """The spec of a backend given by name or callable; an unknown name lists the available ones."""
    if isinstance(backend, str):
        name = _ALIASES.get(backend, backend)
        if name not in _BACKENDS:
            _discover()
        if name in _BACKENDS:
            return _BACKENDS[name]
        available = list_backends(exclude_tags=())
        close = difflib.get_close_matches(backend, available, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown ember backend {backend!r}; available: {', '.join(available)}.{hint} "
                         "Pass one of these names, or a callable fn(gm, example_inputs) -> callable.")
    if callable(backend):
        for spec in _BACKENDS.values():
            if spec.fn is backend:
                return spec
        return BackendSpec(getattr(backend, "__name__", type(backend).__name__), backend)
    raise TypeError(f"backend must be a name or a callable, not {type(backend).__name__}")


def lookup_backend(backend) -> Callable:
    return backend_spec(backend).fn


def list_backends(exclude_tags=("debug", "experimental")) -> list[str]:
    """Names of the available backends (aliases included), without those carrying an excluded tag."""
    _discover()
    exclude = set(exclude_tags or ())
    names = [k for k, spec in _BACKENDS.items() if not exclude.intersection(spec.tags)]
    names += [a for a, t in _ALIASES.items() if t in names]
    return sorted(names)


def validate_options(spec: BackendSpec, options: dict):
    """Check ``options`` against the backend's declared keys and types. A backend that declares a
    ``BackendOptions`` class gets an instance of it (checked once, here); one that declares a dict of
    ``OptionSpec`` gets a dict with the defaults filled."""
    if spec.options is None:
        return dict(options)
    if hasattr(spec.options, "validate"):  # a table of its own (the ember backend's inductor names)
        return spec.options.validate(options)
    if isinstance(spec.options, type) and issubclass(spec.options, BackendOptions):
        return _validate_fields(spec, options)
    unknown = set(options) - set(spec.options)
    if unknown:
        raise unknown_options_error(spec.name, unknown, spec.options, _EVERY_BACKEND)
    out = {}
    for key, opt in spec.options.items():
        value = options.get(key, opt.default)
        if not isinstance(value, opt.type):
            raise TypeError(f"option {key!r} of backend {spec.name!r} must be {opt.type.__name__}, "
                            f"got {type(value).__name__} ({value!r})")
        out[key] = value
    return out


_EVERY_BACKEND = " (and 'guard_filter_fn', which every backend takes)"


def _validate_fields(spec: BackendSpec, options: dict):
    fields = {f.name: f for f in dataclasses.fields(spec.options)}
    unknown = set(options) - set(fields)
    if unknown:
        raise unknown_options_error(spec.name, unknown, fields, _EVERY_BACKEND)
    for key, value in options.items():
        if not type_ok(fields[key], value):
            raise type_error(spec.name, fields[key], value)
    return spec.options(**options)  # its __post_init__ checks ranges


from ember.backends import eager  # noqa: E402,F401  (registers the built-in backends)
from ember.backends import ember_backend  # noqa: E402,F401  (the default, "ember" alias "inductor")
from ember.backends import aot_eager  # noqa: E402,F401
from ember.backends import openvino  # noqa: E402,F401  (openvino, openvino_ts; imports openvino lazily)
from ember.backends import cudagraphs  # noqa: E402,F401
