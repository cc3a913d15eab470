"""Backends by name. A backend is ``fn(gm: torch.fx.GraphModule, example_inputs: list) -> callable``,
the contract torch.compile backends use, so either side's backends plug into the other."""
from __future__ import annotations

from typing import Callable

_BACKENDS: dict[str, Callable] = {}
_TAGS: dict[str, tuple] = {}


def register_backend(compiler_fn: Callable | None = None, name: str | None = None, tags: tuple = ()):
    """Register a backend; usable as ``@register_backend`` or ``@register_backend(name=..., tags=...)``."""
    def deco(fn):
        key = name or fn.__name__
        _BACKENDS[key] = fn
        _TAGS[key] = tuple(tags)
        return fn

    if compiler_fn is not None:
        return deco(compiler_fn)
    return deco


def lookup_backend(backend) -> Callable:
    if callable(backend):
        return backend
    if isinstance(backend, str):
        if backend in _BACKENDS:
            return _BACKENDS[backend]
        raise ValueError(f"unknown ember backend {backend!r}; available: {', '.join(sorted(_BACKENDS))}. "
                         "Pass one of these names, or a callable fn(gm, example_inputs) -> callable.")
    raise TypeError(f"backend must be a name or a callable, not {type(backend).__name__}")


def list_backends(exclude_tags=("debug", "experimental")) -> list[str]:
    exclude = set(exclude_tags or ())
    return sorted(k for k, tags in _TAGS.items() if not exclude.intersection(tags))


from ember.backends import eager  # noqa: E402,F401  (registers the built-in backends)
