"""The generated entry function of a cache entry: check guards, load graph inputs, call the compiled
graph, rebuild the return value. One readable Python function per entry, e.g.::

    def __ember_entry_0(x, n):
        # ember: compiled from f at model.py:12; 9 guards
        try:
            if not (__ember_gs_grad() is True and ... and __ember_gs_default_dtype() is __c0):  # global state: GLOBAL_STATE
                return __MISS
            if not (type(x) is __c1 and x.dtype is __c2 and ...):  # x: TENSOR
                return __MISS
            ...
        except Exception:
            return __MISS
        __out = __graph(x)
        return (__out[0], n + 1)
"""
from __future__ import annotations

import inspect
import itertools
from typing import Any

import torch

from ember.frontend.errors import Unsupported
from ember.frontend.sources import ConstSource, GlobalSource, ItemSource, LocalSource, Source

_LITERAL_TYPES = (int, float, bool, str, bytes, type(None))


def _is_literal_key(key) -> bool:
    if type(key) is tuple:
        return all(_is_literal_key(k) for k in key)
    return type(key) in (int, str, bool, bytes, type(None)) or (type(key) is float and key == key and abs(key) != float("inf"))


class MISS_TYPE:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<ember cache miss>"


MISS = MISS_TYPE()


class EntryCodegen:
    def __init__(self, namespace: dict):
        self.ns: dict[str, Any] = dict(namespace)
        self.lines: list[str] = []
        self._temps: dict[Source, str] = {}
        self._const_ids: dict[int, str] = {}
        self._memo: dict[int, str] = {}
        self._counter = itertools.count()
        self.graph_outputs: list = []  # fx nodes, in output order
        self._output_index: dict = {}

    # ---- names ----
    def const(self, value, hint: str = "c") -> str:
        if type(value) in _LITERAL_TYPES and type(value) is not float:  # exact types: a str enum's repr is not syntax
            return repr(value)
        if type(value) is float and value == value and value not in (float("inf"), float("-inf")):
            return repr(value)
        try:
            key = ("eq", type(value), value) if isinstance(value, (torch.device, torch.dtype, type, tuple)) else id(value)
            hash(key)
        except TypeError:
            key = id(value)
        name = self._const_ids.get(key)
        if name is None:
            safe = "".join(ch if ch.isalnum() else "_" for ch in hint)[:20]
            name = f"__{safe}_{next(self._counter)}"
            self.ns[name] = value
            self._const_ids[key] = name
        return name

    def load(self, source: Source) -> str:
        """An expression (a local or a temp) holding the value of ``source``; emits the temp once."""
        if isinstance(source, (LocalSource, ConstSource)):
            return source.expr()
        hit = self._temps.get(source)
        if hit is not None:
            return hit
        parent = source.base()
        if isinstance(source, ItemSource) and not _is_literal_key(source.key):
            # e.g. an enum key: its repr is not Python syntax, so the key itself is a constant
            expr = f"{self.load(parent)}[{self.const(source.key, 'key')}]"
        else:
            expr = source.render(self.load(parent)) if parent is not None else source.expr()
        name = f"__s{next(self._counter)}"
        self.lines.append(f"{name} = {expr}  # {source.name()}")
        self._temps[source] = name
        return name

    def reset_temps(self) -> None:
        """Forget which sources have temps (the next lines go to a section that runs before them)."""
        self._temps = {}

    # ---- outputs ----
    def tensor(self, vt) -> str:
        if vt.source is not None:
            return self.load(vt.source)
        idx = self._output_index.get(vt.node)
        if idx is None:
            idx = len(self.graph_outputs)
            self.graph_outputs.append(vt.node)
            self._output_index[vt.node] = idx
        return f"__out[{idx}]"

    def reconstruct(self, vt) -> str:
        return vt.reconstruct(self)

    def memo(self, vt, build) -> str:
        name = self._memo.get(id(vt))
        if name is None:
            expr = build()
            name = f"__r{next(self._counter)}"
            self.lines.append(f"{name} = {expr}")
            self._memo[id(vt)] = name
        return name



def render_signature(sig: inspect.Signature, ns: dict, skip_first: bool = False) -> tuple[str, list[str]]:
    """Parameter list text for the entry function (defaults bound by name in ``ns``)."""
    params = list(sig.parameters.values())
    if skip_first:
        params = params[1:]
    parts, names = [], []
    seen_kwonly = False
    last_kind = None
    for p in params:
        if p.kind is p.POSITIONAL_ONLY:
            pass
        elif last_kind is p.POSITIONAL_ONLY:
            parts.append("/")
        if p.kind is p.KEYWORD_ONLY and not seen_kwonly:
            parts.append("*")
            seen_kwonly = True
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text = "*" + p.name
            seen_kwonly = True
        elif p.kind is p.VAR_KEYWORD:
            text = "**" + p.name
        elif p.default is not p.empty:
            dname = f"__default_{p.name}"
            ns[dname] = p.default
            text = f"{p.name}={dname}"
        parts.append(text)
        names.append(p.name)
        last_kind = p.kind
    if last_kind is inspect.Parameter.POSITIONAL_ONLY:
        parts.append("/")
    return ", ".join(parts), names


def build_entry(*, name: str, header: str, params: str, self_binding: str | None, guard_lines: list[str],
                body_lines: list[str], call_line: str | None, return_expr: str, ns: dict,
                before_call: list[str] = ()):
    """Assemble, compile and return (function, source text). ``before_call``: lines run once the
    guards passed, before the graph (np.random.seed on torch's stream)."""
    text = entry_text(name, header, params, self_binding, guard_lines, body_lines, call_line, return_expr,
                      before_call)
    ns["__MISS"] = MISS
    code = compile(text, f"<ember entry {name}>", "exec")
    exec(code, ns)  # noqa: S102 - our own generated code
    return ns[name], text


def entry_text(name: str, header: str, params: str, self_binding: str | None, guard_lines: list[str],
               body_lines: list[str], call_line: str | None, return_expr: str, before_call=()) -> str:
    """The entry function's source."""
    src = [f"def {name}({params}):", f"    # {header}"]
    if self_binding:
        src.append(f"    {self_binding}")
    src.append("    try:")
    src += [f"        {ln}" for ln in guard_lines] or ["        pass"]
    src.append("    except Exception:")
    src.append("        return __MISS")
    src += [f"    {ln}" for ln in before_call]
    if call_line:
        src.append(f"    {call_line}")
    src += [f"    {ln}" for ln in body_lines]
    src.append(f"    return {return_expr}")
    return "\n".join(src) + "\n"
