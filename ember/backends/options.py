"""Typed backend options: each backend declares one frozen dataclass, a doc per field, checked once.

A backend's options class subclasses ``BackendOptions`` and declares its fields with ``option(...)``::

    @dataclass(frozen=True)
    class MyOptions(BackendOptions):
        backend: ClassVar[str] = "mine"
        block: int = option(128, "largest block", min=1)

``MyOptions.from_dict(d)`` rejects an unknown key (did-you-mean and the valid names), a value of the
wrong type or out of range (naming the field and what it means), and the object then travels down the
backend's pipeline as it is: one default per setting, read as an attribute, never ``.get(key, default)``.
The registry (``register_backend(options=MyOptions)``) checks ``ember.compile(options=...)`` against
the same fields, so the error is raised where the options are written.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, ClassVar

_TYPE_WORDS = {bool: "bool", int: "int", str: "str", float: "float"}


def option(default: Any, doc: str, *, min: int | None = None, accepts: tuple | None = None,
           kind: str | None = None):
    """A field of a backend's options: ``doc`` says what it means (errors and docs show it); ``min`` the
    smallest number allowed; ``accepts`` the types a value may have (default: the default's type, exactly,
    so True is no int); ``kind`` how errors name those types."""
    if accepts is None:
        accepts = (type(default),)
    kind = kind or " or ".join(_TYPE_WORDS.get(t, t.__name__) for t in accepts)
    return dataclasses.field(default=default, metadata={"doc": doc, "min": min, "accepts": accepts, "kind": kind})


def type_ok(f: dataclasses.Field, value) -> bool:
    accepts = f.metadata["accepts"]
    if value is None and f.default is None:
        return True  # None: not given (the backend applies its own fallback)
    if type(value) is bool:
        return bool in accepts
    return isinstance(value, accepts)


def unknown_options_error(backend: str, unknown, valid, note: str = "") -> ValueError:
    unknown = sorted(unknown, key=repr)  # keys of any type
    close = difflib.get_close_matches(str(unknown[0]), list(valid), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"unknown option(s) {', '.join(map(repr, unknown))} for backend {backend!r}{hint}; "
                      f"valid options: {', '.join(sorted(valid)) or 'none'}{note}")


def type_error(backend: str, f: dataclasses.Field, value) -> TypeError:
    return TypeError(f"option {f.name!r} of backend {backend!r} must be {f.metadata['kind']}, "
                     f"got {type(value).__name__} ({value!r}) ({f.name}: {f.metadata['doc']})")


@dataclasses.dataclass(frozen=True)
class BackendOptions:
    backend: ClassVar[str] = "?"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not type_ok(f, value):
                raise type_error(self.backend, f, value)
            lo = f.metadata.get("min")
            if lo is not None and value is not None and value < lo:
                raise ValueError(f"option {f.name!r} of backend {self.backend!r} must be >= {lo}, got {value!r} "
                                 f"({f.name}: {f.metadata['doc']})")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, options=None, **overrides):
        """The options object of ``options`` (a dict, an instance, or None for the defaults), with
        ``overrides`` on top; every key and value checked."""
        if isinstance(options, cls):
            return dataclasses.replace(options, **overrides) if overrides else options
        given = {**dict(options or {}), **overrides}
        unknown = set(given) - set(cls.names())
        if unknown:
            raise unknown_options_error(cls.backend, unknown, cls.names())
        return cls(**given)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def markdown_table(cls) -> str:
        rows = ["| Option | Default | Meaning |", "|---|---|---|"]
        rows += [f"| `{f.name}` | `{f.default!r}` | {f.metadata['doc']} |" for f in dataclasses.fields(cls)]
        return "\n".join(rows) + "\n"
