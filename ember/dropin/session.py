"""One ``ember run``: torch's compile surface routed to ember while the script runs, put back after.

- ``torch.compile`` and the ``torch.compiler`` functions are replaced at once (torch imports them).
- ``torch._dynamo`` and ``torch._inductor.config`` are not imported by ember: when the script (or a
  library) imports them, ``hooks.AfterImport`` lets the session put ember's functions on
  ``torch._dynamo`` and proxies in place of the two config modules. A proxy stores every setting in
  torch's own config (so torch's validation and any library reading it see what the script set) and
  translates the knobs ember has (tables.py, inductor_options.py) into ember; the others are noted once.

Why not a stand-in module for ``torch._dynamo``: libraries import its submodules
(transformers: ``torch._dynamo._trace_wrapped_higher_order_op``), which need the real package.
"""
from __future__ import annotations

import contextlib
import json
import sys
import types

import torch

import ember
from ember.backends import inductor_options
from ember.config import config
from ember.diagnostics import counters
from ember.diagnostics.logging import notice_once
from ember.dropin import functions, tables
from ember.dropin.hooks import AfterImport

DYNAMO, DYNAMO_CONFIG, INDUCTOR_CONFIG = "torch._dynamo", "torch._dynamo.config", "torch._inductor.config"


class ConfigProxy(types.ModuleType):
    """Stands where a torch config module stood; reads and writes go to that module, and each write
    also goes to ``on_set(name, value)``."""

    def __init__(self, real, on_set, prefix: str = ""):
        super().__init__(getattr(real, "__name__", "config"), getattr(real, "__doc__", None))
        for attr in ("__spec__", "__file__", "__package__", "__loader__"):
            if hasattr(real, attr):
                object.__setattr__(self, attr, getattr(real, attr))
        object.__setattr__(self, "_ember_real", real)
        object.__setattr__(self, "_ember_on_set", on_set)
        object.__setattr__(self, "_ember_prefix", prefix)

    def __getattr__(self, name):
        value = getattr(object.__getattribute__(self, "_ember_real"), name)
        prefix = object.__getattribute__(self, "_ember_prefix")
        if type(value).__name__ == "SubConfigProxy":  # torch's nested config (inductor's triton.*)
            return ConfigProxy(value, object.__getattribute__(self, "_ember_on_set"), f"{prefix}{name}.")
        return value

    def __setattr__(self, name, value):
        real = self._ember_real
        old = getattr(real, name, _MISSING)
        setattr(real, name, value)  # torch checks the name, as without ember
        self._ember_on_set(self._ember_prefix + name, value, (real, name, old))

    def __delattr__(self, name):
        # unittest.mock.patch(.object) deletes the setting on exit, then sets the saved value back when
        # the name has gone; torch's config supports that (the delete hides the setting), so must we
        real = self._ember_real
        old = getattr(real, name, _MISSING)
        delattr(real, name)
        now = getattr(real, name, _MISSING)
        if now is not _MISSING:  # the delete showed a default: ember follows it
            self._ember_on_set(self._ember_prefix + name, now, (real, name, old))

    def __dir__(self):
        return dir(self._ember_real)

    def patch(self, arg1=None, arg2=None, **kwargs):
        """``config.patch(name, value)`` / ``patch({name: value})`` / ``patch(name=value)``: a context
        manager and decorator, going through this proxy's writes."""
        changes = dict(kwargs)
        if isinstance(arg1, dict):
            changes.update(arg1)
        elif arg1 is not None:
            changes[arg1] = arg2
        proxy = self
        # torch's ContextDecorator: on a unittest.TestCase class it patches around the class's tests (as
        # torch's config.patch does); contextlib's would turn the class into a function and no test would run
        from torch.utils._config_module import ContextDecorator

        class _Patch(ContextDecorator):
            def __enter__(self):
                self.old = {k: getattr(proxy, k) for k in changes}
                for k, v in changes.items():
                    setattr(proxy, k, v)

            def __exit__(self, *exc):
                for k, v in self.old.items():
                    setattr(proxy, k, v)
                return False

        return _Patch()


class Session:
    """``with Session(): runpy...``: the routing of one script run."""

    def __init__(self):
        self.assume_static_by_default = True
        self.saved_config: dict = {}     # ember.config field -> value before the script changed it
        self.saved_attrs: list = []      # (object, name, old value or _MISSING)
        self.saved_modules: dict = {}    # sys.modules name -> old entry
        self.saved_torch: dict = {}      # torch config settings the script changed -> (config, name, old)
        self.stance = None
        self.finder = AfterImport({DYNAMO: self._dynamo_imported, INDUCTOR_CONFIG: self._inductor_config_imported})

    # -- installing ------------------------------------------------------------------------------
    def __enter__(self):
        self._set(torch, "compile", functions.wraps_compile(self))
        for name, fn in functions.compiler_routes().items():
            self._set(torch.compiler, name, fn)
        inductor_options.accept_unknown = True
        self.finder.install()
        # imported before the script started (by a sitecustomize, say): routed now
        if DYNAMO in sys.modules:
            self._dynamo_imported(sys.modules[DYNAMO])
        if INDUCTOR_CONFIG in sys.modules:
            self._replace_module(INDUCTOR_CONFIG, self._inductor_config_imported(sys.modules[INDUCTOR_CONFIG]))
        return self

    def __exit__(self, *exc):
        self.finder.remove()
        inductor_options.accept_unknown = False
        inductor_options.GLOBAL.clear()
        for obj, name, old in reversed(self.saved_attrs):
            if old is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, old)
        for name, old in self.saved_modules.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
        for real, name, old in reversed(list(self.saved_torch.values())):
            setattr(real, name, old)
        for field, old in self.saved_config.items():
            setattr(config, field, old)
        if self.stance is not None:
            self.stance.__exit__(None, None, None)
        return False

    def _set(self, obj, name, value) -> None:
        self.saved_attrs.append((obj, name, obj.__dict__.get(name, _MISSING)))
        setattr(obj, name, value)

    def _replace_module(self, name: str, replacement) -> None:
        self.saved_modules.setdefault(name, sys.modules.get(name))
        sys.modules[name] = replacement

    def _dynamo_imported(self, module):
        for name, fn in functions.DYNAMO.items():
            self._set(module, name, fn)
        real = module.__dict__.get("config")
        if real is not None and not isinstance(real, ConfigProxy):
            proxy = ConfigProxy(real, self._dynamo_config_set)
            self._set(module, "config", proxy)
            self._replace_module(DYNAMO_CONFIG, proxy)
        return None  # the package itself stays in sys.modules

    def _inductor_config_imported(self, module):
        if isinstance(module, ConfigProxy):
            return module
        parent = sys.modules.get("torch._inductor")
        proxy = ConfigProxy(module, self._inductor_config_set)
        if parent is not None:
            self._set(parent, "config", proxy)
        self.saved_modules.setdefault(INDUCTOR_CONFIG, module)
        return proxy

    # -- translating ------------------------------------------------------------------------------
    def _remember(self, undo) -> None:
        """The value torch's config had before the script first set it (put back at the end)."""
        real, name, old = undo
        if old is not _MISSING:
            self.saved_torch.setdefault((id(real), name), undo)

    def _dynamo_config_set(self, name: str, value, undo) -> None:
        self._remember(undo)
        knob = tables.DYNAMO_CONFIG.get(name)
        where = f"torch._dynamo.config.{name} = {value!r}"
        if knob is None:
            notice_once(("dynamo-config", name), f"{where}: accepted; {tables.GENERIC_NOTE}")
        elif knob.field is not None:
            self.saved_config.setdefault(knob.field, getattr(config, knob.field))
            try:
                setattr(config, knob.field, value)
            except (TypeError, ValueError) as exc:  # e.g. a limit of 0, which ember.config refuses
                notice_once(("dynamo-config-bad", name, repr(value)), f"{where}: not applied to ember: {exc}")
        elif knob.session == "assume_static_by_default":
            self.assume_static_by_default = bool(value)
        elif knob.session == "disable":
            if self.stance is not None:
                self.stance.__exit__(None, None, None)
                self.stance = None
            if value:
                self.stance = ember.set_stance("force_eager")
        else:
            notice_once(("dynamo-config", name), f"{where}: accepted; {knob.note}")

    def _inductor_config_set(self, name: str, value, undo) -> None:
        self._remember(undo)
        if name in inductor_options.MEANINGS:
            inductor_options.GLOBAL[name] = bool(value)  # read by the ember backend at each graph compile
        else:
            why = inductor_options.ALREADY.get(name, "it has no ember equivalent; ignored")
            notice_once(("inductor", name), f"torch._inductor.config.{name} = {value!r}: accepted; {why}")

    # -- the end ---------------------------------------------------------------------------------
    @staticmethod
    def write_stats(path: str) -> None:
        """The compile counters as JSON (``ember.config.run_stats``; tests read it)."""
        with open(path, "w") as f:
            json.dump({**counters.compiled_snapshot(), **counters.snapshot()}, f, indent=1, sort_keys=True)


_MISSING = object()
