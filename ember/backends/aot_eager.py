"""The ``aot_eager`` backend: ember's autograd layer with ATen graphs run eagerly.

Useful to check the autograd layer on its own (tracing, functionalization, partitioning, the runtime)
before a real code generator is involved: any difference from eager is the layer's fault. Tagged
``debug`` like torch.compile's backend of the same name (``list_backends()`` leaves it out).
"""
from __future__ import annotations

import functools

from ember.backends.registry import register_backend


@functools.lru_cache(maxsize=1)
def _compiler():
    # the autograd layer loads at the first compile, not at ``import ember`` (ember/__init__.py)
    from ember.aot import aot_autograd, run_graph_eagerly
    return aot_autograd(fw_compiler=run_graph_eagerly)


@register_backend(name="aot_eager", tags=("debug",), options={})
def aot_eager(gm, example_inputs):
    return _compiler()(gm, example_inputs)
