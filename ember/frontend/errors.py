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


class CompileError(RuntimeError):
    """Raised to the user under fullgraph=True (or for bad input): names the construct and file:line."""


class InternalError(RuntimeError):
    """An ember bug: the interpreter reached a state it does not model."""
