"""Errors raised while tracing. ``Unsupported`` is what a graph break or fallback reports to users."""
from __future__ import annotations


class Unsupported(Exception):
    """A construct the symbolic interpreter cannot put in a graph.

    ``reason`` is plain words; ``location`` is the user's ``file:line`` (filled in by the interpreter
    that hit it); ``hint`` says what the user can do.
    """

    def __init__(self, reason: str, hint: str = "", location: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.hint = hint
        self.location = location
        self.user_stack: list[str] = []
        self.inner_depth = 0          # depth of the translator that hit it (1: the compiled frame)
        self.frame_index: int | None = None  # the compiled frame's instruction at the time
        self.frame_code = None
        # raised by a call that must not be traced but whose callee is compiled on its own (a
        # wrapper module: trace_rules.WRAPPER_MODULES), as for a call that broke inside the callee
        self.compile_callee = False

    def __str__(self) -> str:
        text = self.reason
        if self.location:
            text += f"\n  at {self.location}"
        for loc in self.user_stack[1:]:
            text += f"\n  called from {loc}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class TracedException(Unsupported):
    """An exception the traced program raises itself (a missing dict key or attribute, a ``raise``),
    with its type and arguments known. A traced ``try`` whose ``except`` matches catches it and the
    trace goes on; anywhere else it is a graph break like any other Unsupported, and the code then
    raises it for real.

    ``exc_type`` is the exception class, ``args`` its arguments (variable trackers), ``value`` the
    tracker of the exception object once one exists (a re-raise keeps it)."""

    def __init__(self, exc_type: type, args: list | None = None, reason: str | None = None, value=None):
        super().__init__(reason or f"raising {exc_type.__name__}")
        self.exc_type = exc_type
        self.args_vts = args or []
        self.value = value


class CompileError(RuntimeError):
    """Raised to the user under fullgraph=True (or for bad input): names the construct and file:line."""


class DivergentCompileError(CompileError):
    """Ranks of one torch.distributed process group compiled different graphs, or one compiled a graph
    the others did not (ember/distributed/divergence.py): their collectives would no longer match."""


class BackendCompilerFailed(CompileError):
    """A backend raised while compiling a captured graph (torch.compile's ``BackendCompilerFailed``).

    The message names the backend, the graph (compiled function, file:line, size) and how to find
    the culprit; the backend's exception is ``inner_exception`` and ``__cause__``. The failure is
    remembered for the guard set it was compiled for: calls that pass those guards raise it again
    without calling the backend (or run eagerly, under ``ember.config.suppress_errors``).
    """

    def __init__(self, message: str, *, backend_name: str, inner_exception: Exception, headline: str,
                 advice: str):
        super().__init__(message)
        self.backend_name = backend_name
        self.inner_exception = inner_exception
        self.headline = headline  # what failed, where
        self.advice = advice      # how to tell a capture fault from a backend fault
        self.__cause__ = inner_exception  # as `raise ... from inner_exception`, though raised later
        self.__suppress_context__ = True


class InternalError(RuntimeError):
    """An ember bug: the interpreter reached a state it does not model."""
