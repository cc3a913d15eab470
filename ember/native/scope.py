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


class Names:
    """The names a renderer's kernel gives its buffers and temporaries: ``in_ptrN`` / ``out_ptrN`` in
    the order buffers are first used (``args``), ``tmpN`` in order. Needs ``ptr`` (dict), ``args``
    (list) and ``tmp`` (int) on the emitter."""

    def pointer(self, buf, out=False):
        if buf not in self.ptr:
            prefix = "out_ptr" if out else "in_ptr"
            self.ptr[buf] = f"{prefix}{sum(1 for v in self.ptr.values() if v.startswith(prefix))}"
            self.args.append(buf)
        return self.ptr[buf]

    def new_tmp(self):
        self.tmp += 1
        return f"tmp{self.tmp - 1}"
