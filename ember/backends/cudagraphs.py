"""The ``cudagraphs`` backend: ember's autograd layer with each ATen graph run eagerly, but replayed
as a CUDA graph (``ember/cudagraphs``). No code generation: it isolates what CUDA graphs alone buy,
as torch.compile's backend of the same name does. Graphs that cannot be captured (CPU tensors,
symbolic sizes, host synchronization) run eagerly; the reason is logged on ``ember.cudagraphs``.
"""
from __future__ import annotations

from ember.backends.registry import register_backend

_backend = None


@register_backend(name="cudagraphs", options={})
def cudagraphs(gm, example_inputs):
    global _backend
    if _backend is None:  # imported on first use, like the default backend
        from ember.aot import aot_autograd, run_graph_eagerly
        from ember.cudagraphs import wrap_compiler

        _backend = aot_autograd(fw_compiler=wrap_compiler(run_graph_eagerly))
    return _backend(gm, example_inputs)
