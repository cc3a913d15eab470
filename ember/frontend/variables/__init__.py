"""Variable trackers: the symbolic values the interpreter pushes on its stack.

Build them only through ``builder.wrap`` (values with a source) or ``builder.wrap_const`` (values made
during tracing); the concrete classes live one family per module.
"""
from ember.frontend.variables.base import ConstantVariable, NullVariable, VariableTracker  # noqa: F401
