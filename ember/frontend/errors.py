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


class InternalError(RuntimeError):
    """An ember bug: the interpreter reached a state it does not model."""
