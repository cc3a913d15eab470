"""ember: a pure-Python implementation of the torch.compile system.

``model = ember.compile(model)`` captures tensor work from Python bytecode into guarded torch.fx
graphs and hands them to a backend.
"""
from ember.api import EmberFunction as EmberFunction
from ember.api import OptimizedModule as OptimizedModule
from ember.api import compile as compile
from ember.backends.registry import list_backends as list_backends
from ember.backends.registry import register_backend as register_backend
from ember.config import config as config
from ember.frontend.errors import CompileError as CompileError
from ember.frontend.errors import Unsupported as Unsupported
from ember import testing as testing

__version__ = "0.1.0"

__all__ = ["compile", "EmberFunction", "OptimizedModule", "list_backends", "register_backend", "config",
           "CompileError", "Unsupported", "testing", "__version__"]
