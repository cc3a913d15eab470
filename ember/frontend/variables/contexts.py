"""Grad-mode and autocast context managers: entered and exited inside the graph.

Entering emits a graph node that switches the mode at run time, and switches the same mode for real
while tracing so fake-tensor propagation sees it; the interpreter undoes any mode still set when a
trace ends or fails.
"""
from __future__ import annotations

import functools

import torch

from ember.frontend.errors import TracedException, Unsupported
from ember.frontend.variables.base import ConstantVariable, MethodTable, VariableTracker, trackers


class ContextVariable(VariableTracker):
    METHODS = MethodTable()

    def enter(self, tx) -> VariableTracker:
        raise NotImplementedError

    def exit(self, tx) -> None:
        raise NotImplementedError

    def method_missing(self, tx, name, args, kwargs):
        raise Unsupported(f"{self.describe()}.{name}()")

    @METHODS("__enter__")
    def _enter(self, tx, args, kwargs):
        return self.enter(tx)

    @METHODS("__exit__")
    def _exit(self, tx, args, kwargs):
        self.exit(tx)
        return ConstantVariable(None)

    @METHODS("clone")
    def _clone(self, tx, args, kwargs):
        return self.clone()

    def getattr(self, tx, name):
        if name in ("__enter__", "__exit__", "clone"):
            return trackers.BoundMethodVariable(self, name)
        raise Unsupported(f"reading {name} of {self.describe()}")

    def call(self, tx, args, kwargs):
        # used as a decorator inside the trace: ctx(fn) -> fn running under ctx
        if len(args) == 1 and not kwargs:
            return ContextWrappedFunction(self, args[0])
        raise Unsupported(f"calling {self.describe()}")


def _set_grad(tx, mode: bool) -> None:
    tx.output.graph.call_function(torch._C._set_grad_enabled, (mode,))
    torch._C._set_grad_enabled(mode)


class GradModeContextVariable(ContextVariable):
    def __init__(self, target: bool, entered_at_init: bool = False, prev: bool | None = None):
        self.target = target
        self.entered_at_init = entered_at_init
        self.prev = prev

    def describe(self):
        return f"grad mode context (enabled={self.target})"

    def clone(self):
        return GradModeContextVariable(self.target)

    def enter(self, tx):
        if not self.entered_at_init:
            self.prev = torch.is_grad_enabled()
            tx.push_mode_restore(lambda prev=self.prev: torch._C._set_grad_enabled(prev), self)
            _set_grad(tx, self.target)
        return ConstantVariable(None)

    def exit(self, tx):
        _set_grad(tx, self.prev)
        tx.pop_mode_restore()


    # ---- graph breaks: the graph leaves the mode as it found it; the entry switches it again ----
    def close_for_break(self, tx) -> None:
        tx.output.graph.call_function(torch._C._set_grad_enabled, (self.prev,))

    def reenter_line(self, cg) -> str:
        return f"{cg.const(torch._C._set_grad_enabled, 'set_grad_enabled')}({self.target})"

    def exit_callable(self, cg) -> str:
        return cg.const(functools.partial(_restore_grad, self.prev), "restore_grad")


def _restore_grad(prev: bool, *exc_info):
    """The ``__exit__`` a resumed with-block calls for a grad-mode context entered in a graph."""
    torch._C._set_grad_enabled(prev)
    return False


class GradModeClassVariable(VariableTracker):
    """``torch.no_grad`` / ``enable_grad`` / ``set_grad_enabled`` before they are instantiated, and
    ``torch._C._set_grad_enabled`` (the plain switch, which returns None)."""

    identity_attr = "cls"

    def __init__(self, cls):
        self.cls = cls

    def describe(self):
        return f"torch.{self.cls.__name__}"

    def call(self, tx, args, kwargs):
        if self.cls is torch.no_grad:
            return GradModeContextVariable(False)
        if self.cls is torch.enable_grad:
            return GradModeContextVariable(True)
        # set_grad_enabled(mode) switches the mode as soon as it is created, and restores on exit
        mode = (args[0] if args else kwargs["mode"]).as_constant()
        prev = torch.is_grad_enabled()
        ctx = GradModeContextVariable(bool(mode), entered_at_init=True, prev=prev)
        tx.push_mode_restore(lambda: torch._C._set_grad_enabled(prev), ctx)
        _set_grad(tx, bool(mode))
        return ConstantVariable(None) if self.cls is torch._C._set_grad_enabled else ctx


class AutocastContextVariable(ContextVariable):
    def __init__(self, device_type: str, dtype, enabled: bool, cache_enabled):
        self.args = (device_type, dtype, enabled, cache_enabled)
        self.node = None
        self.real = None

    def describe(self):
        return f"autocast{self.args}"

    def clone(self):
        return AutocastContextVariable(*self.args)

    def enter(self, tx):
        device_type, dtype, enabled, cache = self.args
        self.node = tx.output.graph.call_function(torch.amp.autocast_mode._enter_autocast, self.args)
        self.real = torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache)
        self.real.__enter__()
        tx.push_mode_restore(lambda real=self.real: real.__exit__(None, None, None), self)
        return ConstantVariable(None)

    def exit(self, tx):
        tx.output.graph.call_function(torch.amp.autocast_mode._exit_autocast, (self.node,))
        self.real.__exit__(None, None, None)
        tx.pop_mode_restore()


    def close_for_break(self, tx) -> None:
        tx.output.graph.call_function(torch.amp.autocast_mode._exit_autocast, (self.node,))

    def reenter_line(self, cg) -> str:
        device_type, dtype, enabled, cache = self.args
        obj = cg.memo(self, lambda: f"{cg.const(torch.autocast, 'autocast')}({device_type!r}, "
                                    f"dtype={cg.const(dtype, 'dtype')}, enabled={enabled}, cache_enabled={cache})")
        return f"{obj}.__enter__()"

    def exit_callable(self, cg) -> str:
        return f"{cg.memo(self, lambda: None)}.__exit__"


class AutocastClassVariable(VariableTracker):
    identity_attr = "cls"

    def __init__(self, cls):
        self.cls = cls

    def describe(self):
        return "torch.autocast"

    def call(self, tx, args, kwargs):
        vals = [a.as_constant() for a in args]
        kw = {k: v.as_constant() for k, v in kwargs.items()}
        if self.cls is torch.autocast or self.cls.__module__ == "torch.amp.autocast_mode":
            device_type = vals[0] if vals else kw.pop("device_type")
            vals = vals[1:]
        else:  # torch.cuda.amp.autocast / torch.cpu.amp.autocast
            device_type = "cuda" if "cuda" in self.cls.__module__ else "cpu"
        names = ["dtype", "enabled", "cache_enabled"]
        for n, v in zip(names, vals):
            kw[n] = v
        dtype = kw.get("dtype") or torch.get_autocast_dtype(device_type)
        enabled = kw.get("enabled", True)
        cache = kw.get("cache_enabled")
        if cache is None:
            cache = torch.is_autocast_cache_enabled()
        return AutocastContextVariable(device_type, dtype, bool(enabled), bool(cache))


class ContextWrappedFunction(VariableTracker):
    def __init__(self, ctx: ContextVariable, fn: VariableTracker):
        self.ctx = ctx
        self.fn = fn

    def call(self, tx, args, kwargs):
        ctx = self.ctx.clone()
        ctx.enter(tx)
        try:
            out = self.fn.call(tx, args, kwargs)
        except TracedException:  # a traced try may catch it: leave the mode as the decorator's exit would
            ctx.exit(tx)
            raise
        ctx.exit(tx)
        return out
