"""Per-callable cache of compiled entries, newest first, with the recompile limit.

On a call, each entry's generated function checks its guards and either runs or answers MISS. After
``recompile_limit`` entries, misses run eagerly (one warning), as torch.compile does. Any stance
other than the default (``ember.set_stance``) takes ``_call_with_stance``, off the hot path.

Threads: a hit takes no lock. Entry lists are never changed in place: a compile publishes a new list
(one attribute store), so a caller iterating the old one sees a consistent snapshot. A miss takes
the callable's own lock, looks at the entries again (another thread may have just compiled the
entry this call needs), and only then compiles, under ``ember.locks.COMPILE_LOCK`` (see there).
"""
from __future__ import annotations

import contextlib
import inspect
import re
import threading
import types
import weakref
from typing import Any, Callable

import torch

from ember.config import config
from ember.diagnostics import counters
from ember.diagnostics import logging as elog
from ember.diagnostics.userframe import warn_user
from ember.locks import COMPILE_LOCK
from ember.frontend.codegen import MISS
from ember.frontend.convert import CacheEntry, RootSpec, compile_entry, no_full_collections
from ember.frontend.dynamic import FrameShapeState
from ember.frontend import persist
from ember.frontend import stance as _stance
from ember.frontend import trace_rules
from ember.frontend.breaks import BreakContext
from ember.frontend.codegen import build_entry
from ember.frontend.errors import CompileError, Unsupported
from ember.frontend.guards import explain_failure
from ember.frontend.resume import user_names

# the entry list of a forced backend that has none yet: always this object, so that `_miss` can
# tell by identity whether another thread has published entries since this call looked
_NO_ENTRIES: tuple = ()

# every live cache, so ember.reset() can empty them all
ALL_CACHES: "weakref.WeakSet[FrameCache]" = weakref.WeakSet()


class FrameCache:
    def __init__(self, target, backend: Callable, fullgraph: bool, recompile_limit: int | None = None,
                 guard_filter_fn: Callable | None = None, backend_for: Callable | None = None,
                 dynamic: bool | None = None):
        self.root = RootSpec.of(target)
        self.target = target
        self.backend = backend
        self.fullgraph = fullgraph
        self.recompile_limit = recompile_limit
        self.guard_filter_fn = guard_filter_fn
        # resolves set_stance(force_backend=...) names into compiler functions (the api layer's lookup)
        self.backend_for = backend_for
        self.entries: list[CacheEntry] = []
        self.dynamic = dynamic
        # arguments whose modules are guarded by structure, not identity (BreakContext.shared_forward)
        self.structural: tuple = ()
        self.shapes = FrameShapeState(dynamic)  # sizes seen at earlier compiles (automatic dynamic)
        self.forced_entries: dict = {}  # force_backend -> its own entry list: never mixed with ours
        # backend key (None: our backend, else the forced one) -> entries whose backend raised, guards
        # only: a call they accept re-raises that failure (or runs eagerly), the backend is not retried
        self.failed: dict = {}
        self.recompile_reasons: list[str] = []
        self.compile_count = 0
        self.call_count_under_stance = 0
        self.fallback_reason: str | None = None  # set when the whole callable runs eagerly
        self._limit_warned = False
        self._light: tuple | None = None  # (entries snapshot, light fns) for skip_guard_eval_unsafe
        self._lock = threading.RLock()  # held by the thread compiling this callable (see the docstring)
        # resume functions and callees compiled at this callable's graph breaks: same settings
        self.break_context = BreakContext(
            lambda fn: FrameCache.create(fn, backend, False, recompile_limit, guard_filter_fn, backend_for, dynamic))
        ALL_CACHES.add(self)

    @staticmethod
    def create(target, *args, **kwargs) -> "FrameCache":
        """The cache for ``target``: a ``WrapperModuleCache`` for a wrapper module of
        ``trace_rules.WRAPPER_MODULES`` (DistributedDataParallel), else a FrameCache."""
        if isinstance(target, torch.nn.Module) and trace_rules.wrapped_module_attr(target) is not None:
            return WrapperModuleCache(target, *args, **kwargs)
        return FrameCache(target, *args, **kwargs)

    # the hot path (api.py's wrappers run it inline, where ``inline_hot_path``: keep them alike) ---
    inline_hot_path = True

    def __call__(self, *args, **kwargs):
        if _stance.current is not _stance.DEFAULT:
            return self._call_with_stance(args, kwargs)
        entries = self.entries
        for entry in entries:
            out = entry.fn(*args, **kwargs)
            if out is not MISS:
                return out
        return self._miss(args, kwargs, entries)

    def reset(self) -> None:
        with self._lock:
            self._reset()

    def _reset(self) -> None:
        self.entries = []
        self.forced_entries = {}
        self.failed = {}
        self.recompile_reasons = []
        self.compile_count = 0
        self.fallback_reason = None
        self._limit_warned = False
        self._light = None
        self.shapes = FrameShapeState(self.dynamic)

    # the stance path ----------------------------------------------------------------------
    def _call_with_stance(self, args, kwargs):
        st = _stance.effective()
        if st.disabled or st.stance == "force_eager":
            return self._eager(args, kwargs)
        if st.stance == "eager_then_compile" and not self.entries and self.call_count_under_stance == 0:
            self.call_count_under_stance += 1
            return self._eager(args, kwargs)
        entries, backend, forced = self.entries, self.backend, None
        if st.force_backend is not None:
            backend = self.backend_for(st.force_backend) if self.backend_for else st.force_backend
            forced = st.force_backend
            entries = self.forced_entries.get(forced, _NO_ENTRIES)
        fns = self._light_fns(entries) if st.skip_guard_eval_unsafe else [e.fn for e in entries]
        for fn in fns:
            out = fn(*args, **kwargs)
            if out is not MISS:
                return out
        if st.stance == "eager_on_recompile":
            return self._eager(args, kwargs)
        if st.stance == "fail_on_recompile":
            reason = self.explain_miss(args, kwargs, entries) if entries else "no compiled code yet"
            raise RuntimeError(f"ember.set_stance('fail_on_recompile'): {self.root.name} ({self.root.location()}) "
                               f"would be compiled here ({reason}). Warm it up with these inputs under the "
                               "default stance first, or use stance 'eager_on_recompile' to run such calls eagerly.")
        return self._miss(args, kwargs, entries, backend, forced)

    def _light_fns(self, entries):
        """skip_guard_eval_unsafe: each entry checks only the guard conditions that tell it apart
        from the others (none when there is one entry). Rebuilt when the entry list changes."""
        snapshot = tuple(entries)
        if self._light is not None and self._light[0] == snapshot:
            return self._light[1]
        keyed = [_condition_keys(e) for e in entries]
        shared = set.intersection(*(set(k for conds in ks.values() for k, _ in conds) for ks in keyed)) if keyed else set()
        fns = []
        for e, keys in zip(entries, keyed):
            lines = e.build_args["guard_lines"]
            kept = []
            i = 0
            while i < len(lines):
                if i in keys:
                    conds = [text for key, text in keys[i] if key not in shared]
                    if conds:
                        kept += [f"if not ({' and '.join(conds)}):", lines[i + 1]]
                    i += 2  # the check and its `return __MISS`
                    continue
                kept.append(lines[i])
                i += 1
            args = dict(e.build_args, guard_lines=kept, name=e.build_args["name"] + "_unguarded")
            fns.append(build_entry(**args)[0])
        self._light = (snapshot, fns)
        return fns

    # the miss path ------------------------------------------------------------------------
    def _eager(self, args, kwargs):
        if self.root.kind == "module":  # through __call__: hooks run exactly as in eager
            mod = self.root.self_obj
            if mod.__dict__.get("_compiled_call_impl") is self:  # compiled in place (ember.compile_module_)
                return mod._call_impl(*args, **kwargs)  # what __call__ runs when not compiled
            return mod(*args, **kwargs)
        return self.target(*args, **kwargs)

    def _entries(self, forced=None) -> list:
        return self.entries if forced is None else self.forced_entries.get(forced, _NO_ENTRIES)

    def _publish(self, entry, forced=None) -> None:
        """Add ``entry`` (newest first) by storing a new list: lock-free readers never see a list
        change under them."""
        if forced is None:
            self.entries = [entry, *self.entries]
        else:
            self.forced_entries = {**self.forced_entries, forced: [entry, *self._entries(forced)]}

    def _publish_failed(self, entry, forced=None) -> None:
        self.failed = {**self.failed, forced: [entry, *self.failed.get(forced, _NO_ENTRIES)]}

    def _failed_match(self, args, kwargs, forced):
        for entry in self.failed.get(forced, _NO_ENTRIES):
            if entry.fn(*args, **kwargs) is not MISS:
                return entry
        return None

    def _miss(self, args, kwargs, tried, backend=None, forced=None):
        """``tried``: the entry list this call has already checked (lock-free)."""
        backend = self.backend if backend is None else backend
        failed = self._failed_match(args, kwargs, forced)
        if failed is not None:
            return self._backend_failed(failed, args, kwargs)
        while True:
            with self._lock:
                current = self._entries(forced)
                if current is tried:
                    entry = self._compile_locked(args, kwargs, backend, forced, current)
                    break
            # Another thread published entries meanwhile: check them outside the lock (running an
            # entry may call other compiled callables, which take their own locks).
            for entry in current:
                out = entry.fn(*args, **kwargs)
                if out is not MISS:
                    return out
            tried = current
        if entry is None:
            return self._eager(args, kwargs)
        if entry.failure is not None:
            return self._backend_failed(entry, args, kwargs)
        out = entry.fn(*args, **kwargs)
        if out is MISS:
            bad = self.explain_miss(args, kwargs, [entry])
            raise CompileError(f"ember bug: a freshly compiled entry rejected its own inputs ({bad})\n{entry.source}")
        return out

    def _compile_locked(self, args, kwargs, backend, forced, entries):
        """Compile and publish an entry for this call (the caller holds ``self._lock``); None: run
        this call eagerly (a frame that cannot be traced, or the recompile limit), counted. An entry
        whose ``failure`` is set: its backend raised (published among ``failed``, not ``entries``)."""
        if self.fallback_reason is not None:
            counters.eager_fallback("frame", f"{self.root.name}: {self.fallback_reason}")
            return None
        failed = self._failed_match(args, kwargs, forced)  # another thread's compile just failed
        if failed is not None:
            return failed
        failed = list(self.failed.get(forced, _NO_ENTRIES))
        limit = self.recompile_limit if self.recompile_limit is not None else config.recompile_limit
        if entries or failed:
            reason = user_names(self.explain_miss(args, kwargs, [*entries, *failed]))
            if len(entries) + len(failed) >= limit:
                counters.eager_fallback("recompile_limit", f"{self.root.name}: {reason}")
                if not self._limit_warned:
                    self._limit_warned = True
                    warn_user(f"ember: {self.root.name} hit the recompile limit ({limit}); further cache "
                              f"misses run eagerly. Last reason: {reason}. Raise ember.config.recompile_limit "
                              f"(EMBER_RECOMPILE_LIMIT){limit_advice(reason)}.")
                return None
            counters.bump_compiled("recompiles")
            self.recompile_reasons.append(reason)
            elog.artifact("recompiles", f"recompiling {self.root.name}: {reason}")
        key = self._persist_key() if forced is None else None
        if key is not None:
            with COMPILE_LOCK, _rng_untouched():
                loaded = persist.load(key, self, args, kwargs)
            if loaded is not None:
                self._publish(loaded, forced)
                return loaded
        # the compile and the cache store after it in one window without full collections
        # (``convert.no_full_collections``): the store allocates too, and met the full collection
        # the compile's objects had made due. (Not around a load: a warm start frees little.)
        with no_full_collections():
            return self._compile_new(args, kwargs, backend, forced, entries, failed, key)

    def _compile_new(self, args, kwargs, backend, forced, entries, failed, key):
        try:
            with COMPILE_LOCK, _rng_untouched():
                entry = compile_entry(self.root, args, kwargs, backend, self.guard_filter_fn,
                                      None if self.fullgraph else self.break_context, self.shapes,
                                      self.structural)
        except Unsupported as exc:
            if self.fullgraph:
                raise CompileError(f"ember.compile(fullgraph=True) cannot capture {self.root.name} in one graph: {exc}") from exc
            self.fallback_reason = str(exc)
            msg = f"ember: running {self.root.name} eagerly: {exc}"
            counters.eager_fallback("frame", msg)
            warn_user(msg)
            return None
        if entry.failure is not None:
            self._publish_failed(entry, forced)
            counters.bump("backend_failures")
            return entry
        self.compile_count += 1
        counters.bump_compiled("frames_compiled")
        if entry.graph is not None:
            counters.bump_compiled("graphs_compiled")
        self._publish(entry, forced)
        if config.distributed_check != "off" and torch.distributed.is_available() and torch.distributed.is_initialized():
            from ember.distributed import divergence  # torch.distributed's side of ember: loaded only when in use

            divergence.after_compile(self.root.name, entry, self.recompile_reasons[-1] if entries or failed else None)
        if key is not None and entry.persist is not None:
            self._persist_store(key, entry)
        return entry

    def _persist_key(self) -> str | None:
        """The key of this callable's entries in the frontend cache, or None (not persisted: logged once)."""
        if not config.frontend_cache:
            return None
        try:
            return persist.key_of(self)
        except persist.NotPersistable as e:
            if not getattr(self, "_persist_noted", False):
                self._persist_noted = True
                persist._note(f"ember frontend cache: not used for {self.root.name}: {e}")
            return None

    def _persist_store(self, key: str, entry: CacheEntry) -> None:
        p, entry.persist = entry.persist, None  # (the live objects it holds are not kept with the entry)
        graph = p["graph"]
        try:
            if isinstance(graph, Exception):
                raise graph
            record = persist.record_of(entry, graph, p["inputs"], p["inlined"], p["guards"], p["guards_source"],
                                       self.root.fn)
        except persist.NotPersistable as e:
            persist.STATS["uncacheable"] += 1
            persist._note(f"ember frontend cache: not storing entry {entry.id} of {self.root.name}: {e}")
            return
        persist.store(key, record)

    def _backend_failed(self, entry: CacheEntry, args, kwargs):
        """A call that passes the guards of a graph its backend failed on: raise that failure again
        (the backend is not retried), or under ``config.suppress_errors`` run eagerly, warning once."""
        if not config.suppress_errors:
            raise entry.failure.with_traceback(None)  # a fresh traceback: it does not grow per call
        if not entry.fallback_warned:
            entry.fallback_warned = True
            counters.bump("backend_failures_suppressed")
            failure = entry.failure
            msg = (f"ember: {failure.headline}\nRunning the calls this graph would serve eagerly "
                   f"(ember.config.suppress_errors is on). {failure.advice}")
            elog.artifact("graph_breaks", msg)
            warn_user(msg)
        return self._eager(args, kwargs)

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


class WrapperModuleCache(FrameCache):
    """The cache of a wrapper module (DistributedDataParallel, an FSDP2 module): its call runs as
    plain Python, and while it runs, what it wraps runs compiled by a FrameCache of its own (made
    through ``break_context``, so ``ember.explain`` finds it).

    - DDP: calls of the wrapped module go through nn.Module's own slot for a compiled call,
      ``_compiled_call_impl`` (what ``nn.Module.compile()`` sets), set only for the duration of the
      wrapper's call and cleared while the compiled call runs: an eager fallback of the inner cache
      calls the module again, which must then take the plain path;
    - FSDP2: the module's hooks (all-gather, reshard) run natively around its forward, which is
      compiled: an instance attribute ``forward`` for the duration of the call. The compiled forward
      is shared by every module of the same class whose wrapper caches the same callable made
      (``forwards``: that callable's break context): twelve identical FSDP2 blocks compile their
      forward once, each call reading its own (all-gathered) parameters."""

    forwards: "BreakContext | None" = None  # set by the BreakContext that made this cache
    inline_hot_path = False  # (its __call__ is its own)
    _wrapper_attr: tuple = (None, None)  # (the wrapper's class, wrapped_module_attr's answer for it)

    def __call__(self, *args, **kwargs):
        wrapper = self.root.self_obj
        cls, attr = self._wrapper_attr  # by class: it runs at every call of each FSDP2 block
        if cls is not type(wrapper):
            self._wrapper_attr = (type(wrapper), trace_rules.wrapped_module_attr(wrapper))
            attr = self._wrapper_attr[1]
        if not attr:
            return self._call_with_forward_compiled(wrapper, args, kwargs)
        inner = getattr(wrapper, attr)
        if "_compiled_call_impl" in inner.__dict__:  # compiled by the user (inner.compile()), or re-entered
            return wrapper(*args, **kwargs)
        compiled = self.break_context.compiled_callee(inner)
        if compiled is inner:  # ember.disable'd and the like: nothing to compile
            return wrapper(*args, **kwargs)

        def call_compiled(*a, **k):
            del inner._compiled_call_impl
            try:
                return compiled(*a, **k)
            finally:
                inner._compiled_call_impl = call_compiled

        inner._compiled_call_impl = call_compiled
        try:
            return wrapper(*args, **kwargs)
        finally:
            inner.__dict__.pop("_compiled_call_impl", None)

    def _call_with_forward_compiled(self, module, args, kwargs):
        if "forward" in module.__dict__:  # the user's own instance forward, or re-entered
            return module(*args, **kwargs)
        compiled = (self.forwards or self.break_context).shared_forward(module)
        if compiled is None:
            return module(*args, **kwargs)
        # (object.__setattr__: nn.Module's looks for a parameter, buffer or submodule named 'forward',
        # which add_module and register_* refuse to make)
        object.__setattr__(module, "forward", types.MethodType(compiled, module))
        try:
            return module(*args, **kwargs)
        finally:
            module.__dict__.pop("forward", None)


# what to suggest when the recompile limit is hit, by what changed (the miss reason's wording:
# guards.explain_failure): only a changing tensor size is helped by marking a dimension dynamic
_LIMIT_ADVICE = (
    (re.compile(r"\.shape\[\d+\] changed|shape relation|\.dim\(\) changed"),
     " or mark the changing dimension dynamic (torch._dynamo.mark_dynamic / ember.mark_dynamic), or compile "
     "with dynamic=True"),
    (re.compile(r"^(?P<name>[A-Za-z_]\w*) changed: -?\d+ -> -?\d+$"),
     ": the int argument {name} changed value and is compiled as a constant (dynamic=False or "
     "ember.config.automatic_dynamic off); with dynamic=None (the default) or True it becomes symbolic"),
    (re.compile(r"^(?P<name>.+) changed: -?\d+ -> -?\d+$"),
     ": {name} is an int attribute, part of the compiled code, so each value compiles again; pass it to the "
     "compiled function as an argument instead (then it can become symbolic), or make it a tensor"),
)


def limit_advice(reason: str) -> str:
    for pattern, advice in _LIMIT_ADVICE:
        m = pattern.search(reason)
        if m:
            return advice.format(**m.groupdict())
    return ""


@contextlib.contextmanager
def _rng_untouched():
    """Compiling (tracing, backends running example graphs) must not consume the random generators:
    the compiled call then draws exactly the numbers eager would (dropout masks for the same seed)."""
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


_NAME = re.compile(r"\b__\w+")


def _condition_keys(entry) -> dict:
    """guard line index -> [(key, condition text)]; a key means the same condition in any entry:
    temps replaced by what they load, namespace constants by their identity (two entries may bind
    the same constant name to different objects)."""
    ns = entry.namespace
    temps: dict = {}

    def resolve(text: str) -> str:
        def sub(m):
            tok = m.group(0)
            if tok in temps:
                return f"({temps[tok]})"
            if tok in ns:
                return f"<{type(ns[tok]).__name__}@{id(ns[tok])}>"
            return tok
        return _NAME.sub(sub, text)

    keys = {}
    for i, ln in enumerate(entry.build_args["guard_lines"]):
        if i in entry.guard_conjuncts:
            keys[i] = [(resolve(c), c) for c in entry.guard_conjuncts[i]]
            continue
        code = ln.split("  #", 1)[0]
        if code.startswith("__") and " = " in code:
            name, expr = code.split(" = ", 1)
            temps[name.strip()] = resolve(expr)
    return keys
