"""The built-in backends: ``eager`` runs the captured FX graph as Python; ``ember`` (alias ``inductor``,
so code written for torch.compile runs unchanged) is the default: ember's autograd layer
(ember/aot) traces each graph to ATen with its backward, and the native code generator
(ember/native) turns the ATen graphs into fused Triton kernels on CUDA (CPU tensors run the ATen
graph as it is)."""
from __future__ import annotations

import warnings

from ember.backends.registry import register_alias, register_backend

_MODES_NOT_YET = {"reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}
_warned_modes: set = set()
_native = None


@register_backend(name="eager", tags=("debug",), options={})
def eager(gm, example_inputs):
    return gm.forward


def _native_backend():
    global _native
    if _native is None:  # imported on first use: the ATen tracing and codegen stack is heavy
        from ember.aot import aot_autograd
        from ember.native import DECOMPOSITIONS, compile_aten_graph

        _native = aot_autograd(fw_compiler=compile_aten_graph, bw_compiler=compile_aten_graph,
                               decompositions=DECOMPOSITIONS)
    return _native


@register_backend(name="ember", options={})
def ember_default(gm, example_inputs, mode=None, options=None):
    if mode in _MODES_NOT_YET and mode not in _warned_modes:
        # correct results, just not the mode's extra speed: say so once instead of pretending
        _warned_modes.add(mode)
        warnings.warn(f"ember: mode={mode!r} is accepted but not implemented yet by the 'ember' backend; "
                      "graphs compile with the default settings", stacklevel=2)
    return _native_backend()(gm, example_inputs)


register_alias("inductor", "ember")
