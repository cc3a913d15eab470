"""The ``aot_eager`` backend: ember's autograd layer with ATen graphs run eagerly.

Useful to check the autograd layer on its own (tracing, functionalization, partitioning, the runtime)
before a real code generator is involved: any difference from eager is the layer's fault. Tagged
``debug`` like torch.compile's backend of the same name (``list_backends()`` leaves it out).
"""
from __future__ import annotations

from ember.aot import aot_autograd, run_graph_eagerly
from ember.backends.registry import register_backend

aot_eager = register_backend(aot_autograd(fw_compiler=run_graph_eagerly), name="aot_eager", tags=("debug",),
                             options={})
