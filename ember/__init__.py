"""ember: a pure-Python implementation of the torch.compile system.

``model = ember.compile(model)`` captures tensor work from Python bytecode into guarded torch.fx
graphs and hands them to a backend. The rest of this namespace mirrors ``torch.compiler``;
``ember.export`` mirrors ``torch.export``.

Names load on first use (PEP 562), so ``import ember.export.aot_runtime`` (what a server loading an
AOT package imports) does not pull in the frontend. ``import ember`` itself stays cheap; the first
``ember.compile`` imports the rest.
"""
import importlib as _importlib

from ember.config import config as config  # eager: a later submodule import must not rebind ember.config
from ember.diagnostics import logging as _logging

for _name in _logging.ARTIFACTS:  # ember's loggers exist from `import ember` on, as before names loaded lazily
    _logging.get_logger(_name)


def _start_triton_key() -> None:
    """Triton's cache key, which the first kernel build waits for, starts in a child process now on a
    machine with an NVIDIA GPU (``ember/triton_key.py``)."""
    from ember import triton_key as key_process
    if key_process.wanted():
        key_process.start()


_start_triton_key()

# public name -> module it is defined in
_LAZY = {
    "EmberFunction": "ember.api", "OptimizedModule": "ember.api", "compile": "ember.api", "explain": "ember.api",
    "compile_module_": "ember.api",
    "list_backends": "ember.backends.registry", "register_backend": "ember.backends.registry",
    "allow_in_graph": "ember.control", "disable": "ember.control", "is_compiling": "ember.control",
    "is_exporting": "ember.control", "reset": "ember.control", "set_stance": "ember.control",
    "substitute_in_graph": "ember.control",
    "ConstraintViolation": "ember.frontend.dynamic", "mark_dynamic": "ember.frontend.dynamic",
    "maybe_mark_dynamic": "ember.frontend.dynamic", "mark_static": "ember.frontend.dynamic",
    "BackendCompilerFailed": "ember.frontend.errors", "CompileError": "ember.frontend.errors",
    "Unsupported": "ember.frontend.errors", "DivergentCompileError": "ember.frontend.errors",
    "GuardFilterEntry": "ember.frontend.guard_filter",
    "keep_tensor_guards_unsafe": "ember.frontend.guard_filter",
    "skip_all_guards_unsafe": "ember.frontend.guard_filter",
    "skip_guard_on_all_nn_modules_unsafe": "ember.frontend.guard_filter",
    "skip_guard_on_globals_unsafe": "ember.frontend.guard_filter",
    "skip_guard_on_inbuilt_nn_modules_unsafe": "ember.frontend.guard_filter",
}
_SUBMODULES = ("testing", "export")

__version__ = "0.1.0"

__all__ = [
    "compile", "compile_module_", "EmberFunction", "OptimizedModule", "list_backends", "register_backend", "config",
    "explain", "set_stance", "disable", "reset", "allow_in_graph", "substitute_in_graph", "is_compiling", "is_exporting",
    "GuardFilterEntry", "keep_tensor_guards_unsafe", "skip_all_guards_unsafe", "skip_guard_on_all_nn_modules_unsafe",
    "skip_guard_on_globals_unsafe", "skip_guard_on_inbuilt_nn_modules_unsafe",
    "mark_dynamic", "maybe_mark_dynamic", "mark_static", "ConstraintViolation",
    "CompileError", "BackendCompilerFailed", "DivergentCompileError", "Unsupported", "testing", "export", "__version__",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = _importlib.import_module(f"ember.{name}")
    else:
        raise AttributeError(f"module 'ember' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
