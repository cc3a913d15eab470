"""Graph modules whose ``code`` is text until the graph runs.

torch's ``_LazyGraphModule`` defers code generation to the first read of ``code`` or the first
call; a read of ``code`` still compiles the forward (``compile()`` of the whole generated
function). The caches read the code of every graph they store or key (``aot.cache``'s stored
summary, the native cache's graph key), and none of them runs it: the native backend runs a graph
only as its fallback. For a 24-layer Llama's training step, compiling the forward's and backward's
code only to hash and store it was ~0.3 s of its cold compile on a 2-core CPU (session 38). Here
``code`` answers the generated text and leaves the forward lazy; a call still compiles it as usual.
``recompile()`` (a pass changed the graph) forgets the text, as fx's own recompile would replace it.
"""
from __future__ import annotations

from torch.fx._lazy_graph_module import _LazyGraphModule


class TextCodeGraphModule(_LazyGraphModule):
    """``code`` is generated as text (kept per graph module until ``recompile()``); the forward
    is compiled at its first call. (fx makes one class per instance: class attributes are per graph.)"""

    _ember_code = None

    @classmethod
    def recompile(cls) -> None:
        cls._ember_code = None
        cls.forward = cls._lazy_forward

    @property
    def code(self) -> str:
        if not self._needs_recompile():  # the forward was compiled: fx's own code
            return super().code
        cls = type(self)
        if cls._ember_code is None:
            cls._ember_code = self.graph.python_code(root_module="self").src
        return cls._ember_code


def text_code(gm, graph, class_name: str = "GraphModule") -> TextCodeGraphModule:
    """A ``TextCodeGraphModule`` of ``graph`` with ``gm``'s attributes (as ``GraphModule(gm, graph)``)."""
    return TextCodeGraphModule(gm, graph, class_name=class_name)


def as_text_code(gm):
    """``gm`` (a ``_LazyGraphModule`` as ``make_fx`` makes them under ``_use_lazy_graph_module``) made
    a ``TextCodeGraphModule`` in place: its own class (fx makes one per instance) is swapped for a
    fresh subclass of ``TextCodeGraphModule`` of the same name, whose forward is lazy again. Other
    graph modules are returned as they are."""
    cls = type(gm)
    if isinstance(gm, TextCodeGraphModule) or cls.__bases__ != (_LazyGraphModule,):
        return gm
    gm.__class__ = type(cls.__name__, (TextCodeGraphModule,), {"__module__": cls.__module__})
    return gm
