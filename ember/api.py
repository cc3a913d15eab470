"""Public entry points: ``ember.compile``, the wrappers it returns, and ``ember.explain``. Wiring only."""
from __future__ import annotations

import difflib
import functools
import inspect
import types
from typing import Any, Callable

import torch

from ember.backends.ember_backend import MODES
from ember.backends.regional import compiler_key, with_regions
from ember.backends.registry import backend_spec, validate_options
from ember.distributed import with_ddp_buckets
from ember.diagnostics.explain import EntryReport, ExplainReport, graph_report
from ember.frontend.bytecode import CO_ASYNC_GENERATOR, CO_COROUTINE, CO_GENERATOR, CO_ITERABLE_COROUTINE, check_python_version
from ember.locks import COMPILE_LOCK

_MODES = tuple(MODES)  # the default backend's mode table (backends/ember_backend.py)


def compile(model: Callable | None = None, *, fullgraph: bool = False, dynamic: bool | None = None,
            backend: str | Callable = "ember", mode: str | None = None, options: dict | None = None,
            disable: bool = False):
    """Compile ``model`` (a function, method or nn.Module); same signature as ``torch.compile``.

    Works as ``ember.compile(fn)``, ``@ember.compile`` and ``@ember.compile(backend=...)``.
    """
    _check_arguments(fullgraph, dynamic, mode, options, disable)  # here, so a decorator fails where it is written
    if model is None:
        return functools.partial(compile, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                                 options=options, disable=disable)
    check_python_version()
    if not callable(model):
        raise TypeError(f"ember.compile expects a function or an nn.Module, got {type(model).__name__} "
                        "(a non-callable); pass the function itself, e.g. ember.compile(f), not ember.compile(f()).")
    cache_args = _cache_args(fullgraph, dynamic, backend, mode, options)
    if disable:
        return model
    if isinstance(model, torch.nn.Module):
        return OptimizedModule(model, cache_args)
    fn = model.__func__ if isinstance(model, types.MethodType) else model
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE):
        kind = "coroutine" if code.co_flags & (CO_COROUTINE | CO_ITERABLE_COROUTINE) else "generator"
        raise TypeError(f"ember.compile cannot compile {fn.__qualname__}: it is a {kind} function. Compile the "
                        f"function that consumes it, or the tensor work inside it, instead.")
    return EmberFunction(model, cache_args)


def compile_module_(module: torch.nn.Module, *, fullgraph: bool = False, dynamic: bool | None = None,
                    backend: str | Callable = "ember", mode: str | None = None, options: dict | None = None,
                    disable: bool = False) -> torch.nn.Module:
    """Compile ``module`` in place, as ``nn.Module.compile()`` does for torch.compile, and return it.

    ``module(...)`` then runs through ember; the module keeps its class, identity and attributes,
    so code that checks them still works (a diffusers pipeline's ``save_pretrained`` after
    ``ember.compile_module_(pipe.unet)``; ``pipe.unet = ember.compile(pipe.unet)`` would store an
    ``ember.OptimizedModule`` that diffusers cannot save). The cache goes into nn.Module's slot for a
    compiled call, ``module._compiled_call_impl``; setting that back to None uncompiles, and copies
    (``copy.deepcopy``, pickling) come out uncompiled, as with ``nn.Module.compile()``.
    Arguments as for ``ember.compile``.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"ember.compile_module_ compiles an nn.Module in place, got {type(module).__name__}; "
                        "use ember.compile for functions")
    _check_arguments(fullgraph, dynamic, mode, options, disable)
    check_python_version()
    cache_args = _cache_args(fullgraph, dynamic, backend, mode, options)
    if disable:
        return module
    from ember import control  # noqa: F401  (as _make_cache: the tracer rules of ember.is_compiling & co.)
    from ember.frontend.cache import FrameCache  # (in-place compiling loads the frontend now)
    # FrameCache's eager path calls a module compiled in place through _call_impl, not module(...)
    # (which would come back here): see FrameCache._eager
    module._compiled_call_impl = FrameCache(module, **cache_args)
    return module


def _cache_args(fullgraph, dynamic, backend, mode, options) -> dict:
    """The FrameCache settings of one ``ember.compile`` call (the backend resolved, options checked)."""
    options = dict(options or {})
    guard_filter_fn = options.pop("guard_filter_fn", None)  # a frontend option, valid for every backend
    if guard_filter_fn is not None and not callable(guard_filter_fn):
        raise TypeError("options['guard_filter_fn'] must be a callable taking the list of guard entries "
                        "and returning one bool per entry")
    regional = options.pop("regional", None)  # a frontend option too: ember/backends/regional.py
    if regional is not None and type(regional) is not bool:
        raise TypeError(f"options['regional'] must be True or False, got {type(regional).__name__} {regional!r}")
    backend_fn = make_compiler(backend, mode, options, regional)
    return dict(backend=backend_fn, fullgraph=fullgraph, guard_filter_fn=guard_filter_fn, dynamic=dynamic,
                backend_for=lambda b: make_compiler(b, None, {}))


def _check_arguments(fullgraph, dynamic, mode, options, disable) -> None:
    """Reject a mistyped argument of ``ember.compile`` by name, before anything is compiled
    (torch.compile would take ``fullgraph="no"`` as true)."""
    for name, value in (("fullgraph", fullgraph), ("disable", disable)):
        if type(value) is not bool:
            raise TypeError(f"ember.compile: {name} must be True or False, got {type(value).__name__} {value!r}")
    if dynamic is not None and type(dynamic) is not bool:
        raise TypeError(f"ember.compile: dynamic must be None, True or False, got {type(dynamic).__name__} "
                        f"{dynamic!r}")
    if mode not in _MODES:
        close = difflib.get_close_matches(mode, [m for m in _MODES if m], n=1) if isinstance(mode, str) else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown mode {mode!r}{hint}; valid modes: {', '.join(repr(m) for m in _MODES)}")
    if options is not None and not isinstance(options, dict):
        if isinstance(options, str) and options in _MODES:
            raise TypeError(f"ember.compile: options takes a dict of backend options, got the string {options!r}, "
                            f"which is a mode: pass mode={options!r} instead")
        raise TypeError(f"ember.compile: options must be a dict of backend options (e.g. "
                        f"{{'guard_filter_fn': f}}), got {type(options).__name__} {options!r}")
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")


def make_compiler(backend, mode: str | None, options: dict, regional: bool | None = None) -> Callable:
    """The backend as ``fn(gm, example_inputs)``, with its mode and validated options bound (passed
    as torch.compile passes them: ``mode=`` and ``options=`` keywords, only when given)."""
    spec = backend_spec(backend)
    bound: dict[str, Any] = {}
    if mode not in (None, "default"):
        if not spec.accepts("mode"):
            raise ValueError(f"backend {spec.name!r} does not take a mode (got mode={mode!r}); modes are "
                             "settings of the 'ember' backend (alias 'inductor')")
        bound["mode"] = mode
    if options:
        bound["options"] = validate_options(spec, options)
        if not spec.accepts("options"):
            raise ValueError(f"backend {spec.name!r} takes no options (got {sorted(options)})")
    prewarm = getattr(spec.fn, "prewarm", None)  # work a backend can start now, while the frontend traces
    if prewarm is not None:
        prewarm()
    compiler = functools.partial(spec.fn, **bound)
    compiler.ember_backend_name = spec.name  # the name a BackendCompilerFailed message gives
    trace_start = getattr(spec.fn, "prewarm_trace", None)  # work to start when a frame's trace starts
    if trace_start is not None:
        compiler.prewarm_trace = trace_start
    # repeated blocks compiled once (backends/regional.py; only ember's stateless backends take part)
    compiler = with_regions(compiler, compiler_key(spec.name if isinstance(backend, str) else "", mode, options),
                            regional)
    # graphs compiled inside a DistributedDataParallel forward: split at its buckets first (ember/distributed)
    return with_ddp_buckets(compiler)


def explain(fn, *, backend="eager"):
    """``explain(fn)(*args, **kwargs)`` compiles and runs ``fn`` once and returns an ExplainReport
    (``ember/diagnostics/explain.py``): what was captured, where and why it broke, the guards."""

    def run(*args, **kwargs) -> ExplainReport:
        report = ExplainReport()
        graph_ids: list = []
        owner: dict = {}
        inner = make_compiler(backend, None, {})

        def recording(gm, example_inputs):
            g = graph_report(gm)
            report.graphs.append(g)
            graph_ids.append(getattr(gm, "meta", {}).get("ember_split", {}).get("parent", id(gm)))  # a DDP bucket's part: its graph's
            compiled_graph = inner(gm, example_inputs)

            def counted(*a):  # how often each graph ran: a loop body's graphs run once per iteration
                g.calls += 1
                return compiled_graph(*a)
            return counted

        compiled = compile(fn, backend=recording)
        report.out = compiled(*args, **kwargs)
        seen: set = set()

        def visit(cache) -> None:
            if id(cache) in seen:
                return
            seen.add(id(cache))
            if cache.fallback_reason is not None:
                report.fallbacks.append((cache.root.name, cache.fallback_reason))
            report.recompile_reasons += [f"{cache.root.name}: {user_names(r)}" for r in cache.recompile_reasons]
            info = resume_info(cache.target)
            loop = None
            if info is not None and info.scope is not None:  # a segment of a loop that runs as Python
                loop = (f"{info.fn.__qualname__}: {info.scope.describe()} "
                        f"({info.code.co_filename}:{decode(info.code)[info.scope.loops[0].heads[0]].lineno})")
            for entry in reversed(cache.entries):
                # a resume function's guards read its restored values: shown by the user's names
                guards = [f"{user_names(g.source.name()) if g.source is not None else 'global state'}: {g.kind.name}"
                          for g in entry.guards
                          if g.source is None or not is_resume_bookkeeping(g.source.name())]
                report.entries.append(EntryReport(cache.root.name, guards, list(entry.breaks)))
                if entry.graph is not None:
                    owner[id(entry.graph)] = cache.root.name
                    if loop is not None:
                        loop_of[id(entry.graph)] = loop
            for sub in cache.break_context.caches():
                visit(sub)

        loop_of: dict = {}
        from ember.frontend.bytecode import decode  # the frontend is loaded by now: the call above traced
        from ember.frontend.resume import is_resume_bookkeeping, resume_info, user_names
        visit(compiled._ember_cache)
        for i, (g, gid) in enumerate(zip(report.graphs, graph_ids), 1):
            g.function = owner.get(gid, "?")
            if gid in loop_of:
                report.loops.setdefault(loop_of[gid], []).append(i)
        return report

    return run


def _make_cache(d: dict, module: bool):
    """The guarded cache of a compiled function or module (``d``: its ``__dict__``), made at its first
    use: the frontend it belongs to loads then, not at ``import ember`` or decoration."""
    global _STANCE, _MISS
    with COMPILE_LOCK:
        if d["_ember_cache_obj"] is None:
            from ember import control  # noqa: F401  (registers the tracer rules of ember.is_compiling & co.)
            from ember.frontend import stance
            from ember.frontend.cache import FrameCache  # the frontend: loaded at the first call
            from ember.frontend.codegen import MISS
            _STANCE, _MISS = stance, MISS
            target, cache_args = d["_ember_cache_args"]
            d["_ember_cache_obj"] = (FrameCache.create if module else FrameCache)(target, **cache_args)
        return d["_ember_cache_obj"]


# What the wrappers' __call__ needs of the frontend to run a cache's hot path itself (FrameCache.__call__
# inline: one frame, and one repacking of the arguments, less per call): set by the first _make_cache.
# Until then a stand-in whose stance is never the default: a cache that came another way (a copy) is
# simply called.
_STANCE, _MISS = types.SimpleNamespace(current=None, DEFAULT=False), None


class EmberFunction:
    """A compiled function: calls go through the guarded cache."""

    def __init__(self, fn, cache_args: dict):
        self._ember_cache_obj = None
        self._ember_cache_args = (fn, cache_args)
        functools.update_wrapper(self, fn)
        self._orig_fn = fn

    @property
    def _ember_cache(self):
        return self._ember_cache_obj or _make_cache(self.__dict__, False)

    def __call__(self, *args, **kwargs):
        cache = self._ember_cache_obj or _make_cache(self.__dict__, False)
        # FrameCache.__call__'s hot path, inline: the newest entry whose guards pass runs
        if _STANCE.current is _STANCE.DEFAULT:
            entries = cache.entries
            if kwargs:
                for entry in entries:
                    out = entry.fn(*args, **kwargs)
                    if out is not _MISS:
                        return out
            else:  # (no keyword arguments: no dict to pass on)
                for entry in entries:
                    out = entry.fn(*args)
                    if out is not _MISS:
                        return out
            return cache._miss(args, kwargs, entries)
        return cache(*args, **kwargs)

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"<ember compiled {getattr(self._orig_fn, '__qualname__', self._orig_fn)!s}>"


class OptimizedModule(torch.nn.Module):
    """Wraps a module: behaves like it (attributes, parameters, state_dict keys), runs compiled."""

    def __init__(self, mod: torch.nn.Module, cache_args: dict):
        super().__init__()
        self._orig_mod = mod  # registered as a submodule: parameters are shared
        self.__dict__["_ember_cache_obj"] = None
        self.__dict__["_ember_cache_args"] = (mod, cache_args)

    @property
    def _ember_cache(self):
        d = self.__dict__
        return d["_ember_cache_obj"] or _make_cache(d, True)

    def __call__(self, *args, **kwargs):
        d = self.__dict__
        cache = d["_ember_cache_obj"] or _make_cache(d, True)
        # FrameCache.__call__'s hot path, inline (not for a wrapper module's cache: its own __call__)
        if cache.inline_hot_path and _STANCE.current is _STANCE.DEFAULT:
            entries = cache.entries
            if kwargs:
                for entry in entries:
                    out = entry.fn(*args, **kwargs)
                    if out is not _MISS:
                        return out
            else:  # (no keyword arguments: no dict to pass on)
                for entry in entries:
                    out = entry.fn(*args)
                    if out is not _MISS:
                        return out
            return cache._miss(args, kwargs, entries)
        return cache(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self(*args, **kwargs)

    def __getattr__(self, name):
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    def __setattr__(self, name, value):
        if name in ("_orig_mod",) or "_orig_mod" not in self.__dict__.get("_modules", {}):
            return super().__setattr__(name, value)
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        delattr(self._orig_mod, name)

    # state_dict() keys equal the original's, so a saved state_dict loads into the plain model
    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, *args, **kwargs):
        # a checkpoint saved from torch.compile's wrapper has every key under "_orig_mod."
        prefix = "_orig_mod."
        if state_dict and all(isinstance(k, str) and k.startswith(prefix) for k in state_dict):
            state_dict = type(state_dict)((k[len(prefix):], v) for k, v in state_dict.items())
        return self._orig_mod.load_state_dict(state_dict, *args, **kwargs)

    def train(self, mode: bool = True):
        self._orig_mod.train(mode)
        return self

    @property
    def training(self):
        return self._modules["_orig_mod"].training if "_orig_mod" in self.__dict__.get("_modules", {}) else True

    @training.setter
    def training(self, value):
        if "_orig_mod" in self.__dict__.get("_modules", {}):
            self._orig_mod.training = value

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)))

    def __repr__(self):
        return f"OptimizedModule({self._orig_mod!r})"
