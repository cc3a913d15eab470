"""Sources: where a traced value lives at run time.

A source renders two ways: ``expr()`` is the Python expression the generated entry function uses to
load the value (fast paths such as ``m._parameters['w']`` instead of ``m.w``), and ``name()`` is what
users read in guard failures and logs (``self.layer.weight``, ``x``, ``global SCALE``).
Sources are immutable and hashable so equal paths share one guard and one graph input.
"""
from __future__ import annotations

from dataclasses import dataclass


class Source:
    def expr(self) -> str:
        raise NotImplementedError

    def name(self) -> str:
        raise NotImplementedError

    def base(self) -> "Source | None":
        return None

    def is_global(self) -> bool:
        b = self.base()
        return b.is_global() if b is not None else False


@dataclass(frozen=True)
class LocalSource(Source):
    local: str

    def expr(self) -> str:
        return self.local

    def name(self) -> str:
        return self.local


@dataclass(frozen=True)
class GlobalSource(Source):
    """A name in a module's globals; ``ns`` is the entry-namespace name bound to that globals dict."""

    global_name: str
    ns: str = "__g"
    module: str = ""

    def expr(self) -> str:
        return f"{self.ns}[{self.global_name!r}]"

    def name(self) -> str:
        if self.ns == "__g" or not self.module:
            return f"global {self.global_name}"
        return f"global {self.module}.{self.global_name}"

    def is_global(self) -> bool:
        return True


@dataclass(frozen=True)
class ConstSource(Source):
    """An object the entry namespace holds directly (the compiled module, a root closure)."""

    ns_name: str
    label: str

    def expr(self) -> str:
        return self.ns_name

    def name(self) -> str:
        return self.label


@dataclass(frozen=True)
class AttrSource(Source):
    parent: Source
    attr: str

    def render(self, p: str) -> str:
        return f"{p}.{self.attr}"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        return f"{self.parent.name()}.{self.attr}"

    def base(self) -> Source:
        return self.parent


@dataclass(frozen=True)
class ModuleSlotSource(Source):
    """``module.<name>`` found in one of nn.Module's dicts: loaded as ``module._parameters['name']``."""

    parent: Source
    slot: str  # "_parameters" | "_buffers" | "_modules"
    key: str

    def render(self, p: str) -> str:
        return f"{p}.{self.slot}[{self.key!r}]"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        if self.key.isidentifier():
            return f"{self.parent.name()}.{self.key}"
        return f"{self.parent.name()}[{self.key}]"

    def base(self) -> Source:
        return self.parent


@dataclass(frozen=True)
class ItemSource(Source):
    parent: Source
    key: object  # a constant: int, str, ...

    def render(self, p: str) -> str:
        return f"{p}[{self.key!r}]"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        return f"{self.parent.name()}[{self.key!r}]"

    def base(self) -> Source:
        return self.parent


@dataclass(frozen=True)
class DictKeysSource(Source):
    """``tuple(d)``: a dict's keys in order, for keys that are no constants (tensors: an optimizer's
    state, keyed by its parameters), indexed by position (ItemSource)."""

    parent: Source

    def render(self, p: str) -> str:
        return f"tuple({p})"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        return f"{self.parent.name()}.keys()"

    def base(self) -> Source:
        return self.parent


@dataclass(frozen=True)
class DictValuesSource(Source):
    """``tuple(d.values())``: the values of such a dict, by position."""

    parent: Source

    def render(self, p: str) -> str:
        return f"tuple({p}.values())"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        return f"{self.parent.name()}.values()"

    def base(self) -> Source:
        return self.parent


@dataclass(frozen=True)
class CellSource(Source):
    """The contents of closure cell ``index`` of a function found at ``parent``."""

    parent: Source
    index: int
    var: str

    def render(self, p: str) -> str:
        return f"{p}.__closure__[{self.index}].cell_contents"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        return f"{self.parent.name()} closure variable {self.var}"

    def base(self) -> Source:
        return self.parent


@dataclass(frozen=True)
class DefaultSource(Source):
    """A default argument value of a function found at ``parent``."""

    parent: Source
    key: object  # int index into __defaults__ or str key of __kwdefaults__
    label: str

    def render(self, p: str) -> str:
        attr = "__defaults__" if isinstance(self.key, int) else "__kwdefaults__"
        return f"{p}.{attr}[{self.key!r}]"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        return f"{self.parent.name()} default of {self.label}"

    def base(self) -> Source:
        return self.parent


@dataclass(frozen=True)
class TypeSource(Source):
    parent: Source

    def render(self, p: str) -> str:
        return f"type({p})"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        return f"type({self.parent.name()})"

    def base(self) -> Source:
        return self.parent
