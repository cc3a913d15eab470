"""Per-callable cache of compiled entries, newest first, with the recompile limit.

On a call, each entry's generated function checks its guards and either runs or answers MISS. After
``recompile_limit`` entries, misses run eagerly (one warning), as torch.compile does.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable

from ember.config import config
from ember.diagnostics import logging as elog
from ember.frontend.codegen import MISS
from ember.frontend.convert import CacheEntry, RootSpec, compile_entry
from ember.frontend.errors import CompileError, Unsupported
from ember.frontend.guards import explain_failure


class FrameCache:
    def __init__(self, target, backend: Callable, fullgraph: bool, recompile_limit: int | None = None):
        self.root = RootSpec.of(target)
        self.target = target
        self.backend = backend
        self.fullgraph = fullgraph
        self.recompile_limit = recompile_limit
        self.entries: list[CacheEntry] = []
        self.recompile_reasons: list[str] = []
        self.compile_count = 0
        self.fallback_reason: str | None = None  # set when the whole callable runs eagerly
        self._limit_warned = False

    # the hot path -------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        for entry in self.entries:
            out = entry.fn(*args, **kwargs)
            if out is not MISS:
                return out
        return self._miss(args, kwargs)

    # the miss path ------------------------------------------------------------------------
    def _eager(self, args, kwargs):
        if self.root.kind == "module":
            return self.root.fn(self.root.self_obj, *args, **kwargs)
        return self.target(*args, **kwargs)

    def _miss(self, args, kwargs):
        if self.fallback_reason is not None:
            return self._eager(args, kwargs)
        limit = self.recompile_limit if self.recompile_limit is not None else config.recompile_limit
        if self.entries:
            reason = self.explain_miss(args, kwargs)
            if len(self.entries) >= limit:
                if not self._limit_warned:
                    self._limit_warned = True
                    warnings.warn(f"ember: {self.root.name} hit the recompile limit ({limit}); further cache "
                                  f"misses run eagerly. Last reason: {reason}. Raise ember.config.recompile_limit "
                                  "(EMBER_RECOMPILE_LIMIT) or mark the changing dimension dynamic.", stacklevel=3)
                return self._eager(args, kwargs)
            self.recompile_reasons.append(reason)
            elog.artifact("recompiles", f"recompiling {self.root.name}: {reason}")
        try:
            entry = compile_entry(self.root, args, kwargs, self.backend)
        except Unsupported as exc:
            if self.fullgraph:
                raise CompileError(f"ember.compile(fullgraph=True) cannot capture {self.root.name} in one graph: {exc}") from exc
            self.fallback_reason = str(exc)
            msg = f"ember: running {self.root.name} eagerly: {exc}"
            elog.artifact("graph_breaks", msg)
            warnings.warn(msg, stacklevel=3)
            return self._eager(args, kwargs)
        self.compile_count += 1
        self.entries.insert(0, entry)
        out = entry.fn(*args, **kwargs)
        if out is MISS:
            bad = self.explain_miss(args, kwargs, [entry])
            raise CompileError(f"ember bug: a freshly compiled entry rejected its own inputs ({bad})\n{entry.source}")
        return out

    def explain_miss(self, args, kwargs, entries=None) -> str:
        """Why the newest entry rejected this call, in plain words."""
        entries = self.entries if entries is None else entries
        sig = self.root.signature
        bound_args = (self.root.self_obj, *args) if self.root.skip_first else args
        try:
            bound = sig.bind(*bound_args, **kwargs)
        except TypeError as exc:
            return f"arguments do not match the signature ({exc})"
        bound.apply_defaults()
        local_values = dict(bound.arguments)
        reasons = []
        for entry in entries:
            ns = entry.namespace

            def evaluate(src, ns=ns):
                return eval(src.expr(), ns, local_values)  # noqa: S307 - our generated expressions

            reasons.append(explain_failure(entry.guards, evaluate) or "unknown guard failure")
        return reasons[0] if reasons else "no entries"
