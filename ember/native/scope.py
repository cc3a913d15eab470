"""``Scope``: a block of generated code with its own common-subexpression cache, shared by the
renderers (``triton_emit``, ``cpp_emit``). A loop body or a branch gets a child scope, so a value
computed outside is reused inside and never the other way round."""
from __future__ import annotations

from ember.native.symbolic import is_size_symbol


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
    """The names a renderer's kernel gives its buffers, temporaries and sizes: ``in_ptrN`` /
    ``out_ptrN`` in the order buffers are first used (``args``), ``tmpN`` in order, ``ksN`` in the
    order size symbols are first read. Needs ``ptr`` (dict), ``args`` (list), ``tmp`` (int) and
    ``size_names`` (dict) on the emitter."""

    # raised for a symbol in an index expression that is no size: the renderer's "cannot express"
    # error (cpp_emit's CppUnsupported: the graph runs with ATen instead)
    unknown_symbol: type = KeyError

    def pointer(self, buf, out=False):
        if buf not in self.ptr:
            prefix = "out_ptr" if out else "in_ptr"
            self.ptr[buf] = f"{prefix}{sum(1 for v in self.ptr.values() if v.startswith(prefix))}"
            self.args.append(buf)
        return self.ptr[buf]

    def new_tmp(self):
        self.tmp += 1
        return f"tmp{self.tmp - 1}"

    def size_name(self, s) -> str:
        """The kernel parameter holding size symbol s (``ks0``, ``ks1``... in order of use, so
        kernels that differ only in which sizes they read share one source)."""
        if not is_size_symbol(s):
            raise self.unknown_symbol(f"symbol {s} in an index expression")
        if s not in self.size_names:
            self.size_names[s] = f"ks{len(self.size_names)}"
        return self.size_names[s]


def node_value(emitter, name, scope):
    """The value of a node of ``emitter``'s kernel as seen from ``scope``, for either renderer: an
    outer node's loaded value, or an inner node's value found in an enclosing scope or computed
    here (recomputed for inner nodes of an earlier loop) and cast to the node's dtype."""
    if emitter.k.roles[name] != "inner":
        return emitter.outer_vals[name]
    s = scope
    while s is not None:
        if name in s.node_vals:
            return s.node_vals[name]
        s = s.parent
    body = emitter.k.bodies[name]
    v = emitter.cast(emitter.value(body, scope), body.dtype, emitter.nodes[name].layout.dtype, scope)
    scope.node_vals[name] = v
    return v
