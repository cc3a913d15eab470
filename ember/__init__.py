"""ember: a pure-Python implementation of the torch.compile system.

``model = ember.compile(model)`` captures tensor work from Python bytecode into guarded torch.fx
graphs and hands them to a backend. The rest of this namespace mirrors ``torch.compiler``.
"""
from ember.api import EmberFunction as EmberFunction
from ember.api import OptimizedModule as OptimizedModule
from ember.api import compile as compile
from ember.api import compile_module_ as compile_module_
from ember.api import explain as explain
from ember.backends.registry import list_backends as list_backends
from ember.backends.registry import register_backend as register_backend
from ember.config import config as config
from ember.control import allow_in_graph as allow_in_graph
from ember.control import disable as disable
from ember.control import is_compiling as is_compiling
from ember.control import is_exporting as is_exporting
from ember.control import reset as reset
from ember.control import set_stance as set_stance
from ember.control import substitute_in_graph as substitute_in_graph
from ember.frontend.dynamic import ConstraintViolation as ConstraintViolation
from ember.frontend.dynamic import mark_dynamic as mark_dynamic
from ember.frontend.dynamic import mark_static as mark_static
from ember.frontend.dynamic import maybe_mark_dynamic as maybe_mark_dynamic
from ember.frontend.errors import BackendCompilerFailed as BackendCompilerFailed
from ember.frontend.errors import CompileError as CompileError
from ember.frontend.errors import Unsupported as Unsupported
from ember.frontend.guard_filter import GuardFilterEntry as GuardFilterEntry
from ember.frontend.guard_filter import keep_tensor_guards_unsafe as keep_tensor_guards_unsafe
from ember.frontend.guard_filter import skip_all_guards_unsafe as skip_all_guards_unsafe
from ember.frontend.guard_filter import skip_guard_on_all_nn_modules_unsafe as skip_guard_on_all_nn_modules_unsafe
from ember.frontend.guard_filter import skip_guard_on_globals_unsafe as skip_guard_on_globals_unsafe
from ember.frontend.guard_filter import skip_guard_on_inbuilt_nn_modules_unsafe as skip_guard_on_inbuilt_nn_modules_unsafe
from ember import testing as testing

__version__ = "0.1.0"

__all__ = [
    "compile", "compile_module_", "EmberFunction", "OptimizedModule", "list_backends", "register_backend", "config",
    "explain", "set_stance", "disable", "reset", "allow_in_graph", "substitute_in_graph", "is_compiling", "is_exporting",
    "GuardFilterEntry", "keep_tensor_guards_unsafe", "skip_all_guards_unsafe", "skip_guard_on_all_nn_modules_unsafe",
    "skip_guard_on_globals_unsafe", "skip_guard_on_inbuilt_nn_modules_unsafe",
    "mark_dynamic", "maybe_mark_dynamic", "mark_static", "ConstraintViolation",
    "CompileError", "BackendCompilerFailed", "Unsupported", "testing", "__version__",
]
