"""ember: a pure-Python implementation of the torch.compile system.

``model = ember.compile(model)`` captures tensor work from Python bytecode into guarded torch.fx
graphs and hands them to a backend. The rest of this namespace mirrors ``torch.compiler``.

``import ember`` loads only what ``ember.compile`` needs to check its arguments and wrap a function
(``ember.api``, ``ember.config``, the backend registry): the frontend, the autograd layer and the
code generators load at the first call of a compiled function. The other names of this namespace
load their module at first use (``_LAZY``, through the module-level ``__getattr__``).
"""
from __future__ import annotations

import importlib

from ember.api import EmberFunction as EmberFunction
from ember.api import OptimizedModule as OptimizedModule
from ember.api import compile as compile
from ember.api import explain as explain
from ember.backends.registry import list_backends as list_backends
from ember.backends.registry import register_backend as register_backend
from ember.config import config as config
from ember import testing as testing

__version__ = "0.1.0"

# public name -> the module that defines it, imported when the name is first read
_LAZY = {
    **dict.fromkeys(("allow_in_graph", "disable", "is_compiling", "is_exporting", "reset", "set_stance",
                     "substitute_in_graph"), "ember.control"),
    **dict.fromkeys(("ConstraintViolation", "mark_dynamic", "mark_static", "maybe_mark_dynamic"),
                    "ember.frontend.dynamic"),
    **dict.fromkeys(("BackendCompilerFailed", "CompileError", "Unsupported"), "ember.frontend.errors"),
    **dict.fromkeys(("GuardFilterEntry", "keep_tensor_guards_unsafe", "skip_all_guards_unsafe",
                     "skip_guard_on_all_nn_modules_unsafe", "skip_guard_on_globals_unsafe",
                     "skip_guard_on_inbuilt_nn_modules_unsafe"), "ember.frontend.guard_filter"),
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later reads skip this function
        return value
    raise AttributeError(f"module 'ember' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "compile", "EmberFunction", "OptimizedModule", "list_backends", "register_backend", "config",
    "explain", "set_stance", "disable", "reset", "allow_in_graph", "substitute_in_graph", "is_compiling", "is_exporting",
    "GuardFilterEntry", "keep_tensor_guards_unsafe", "skip_all_guards_unsafe", "skip_guard_on_all_nn_modules_unsafe",
    "skip_guard_on_globals_unsafe", "skip_guard_on_inbuilt_nn_modules_unsafe",
    "mark_dynamic", "maybe_mark_dynamic", "mark_static", "ConstraintViolation",
    "CompileError", "BackendCompilerFailed", "Unsupported", "testing", "__version__",
]
