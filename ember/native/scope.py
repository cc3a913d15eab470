"""``Scope``: a block of generated code with its own common-subexpression cache, shared by the
renderers (``triton_emit``, ``cpp_emit``). A loop body or a branch gets a child scope, so a value
computed outside is reused inside and never the other way round."""
from __future__ import annotations


class Scope:
    def __init__(self, parent=None):
        self.parent = parent
        self.cache: dict = {}
        self.node_vals: dict = {}
        self.lines: list = []

    def lookup(self, key):
        s = self
        while s is not None:
            if key in s.cache:
                return s.cache[key]
            s = s.parent
        return None
