"""Variable trackers: the symbolic values the interpreter pushes on its stack.

Build them only through ``VariableTracker.build`` (values with a source) or ``VariableTracker.const``
(values made during tracing); the concrete classes live one family per module, and each module
registers the builders of its own types beside its classes (see ``base.register_builder``). Importing
the package imports them all, so the build table is complete before the first trace.
"""
from ember.frontend.variables.base import ConstantVariable, NullVariable, VariableTracker  # noqa: F401
from ember.frontend.variables import (  # noqa: F401  (each registers its builders)
    autograd, contexts, deques, dict_subclasses, dict_views, dicts, distributions, exceptions, functions, iterators, model_outputs,
    modules, numpy_arrays, numpy_random, objects, sequences, sets, symbolic, tensor,
)
