"""ember's native backend: ATen FX graphs -> fused Triton kernels and a Python wrapper.

``compile_aten_graph(gm, example_inputs)`` compiles a graph that ``make_fx`` produced with
``DECOMPOSITIONS`` applied (functionalized), with static or symbolic sizes (dynamic shapes: the
kernels then take their sizes as arguments). See ``backend.py`` for the pipeline.

Both names load on first use, so a generated wrapper importing ``ember.native.runtime`` (as an AOT
package's does, ``ember/export/aot_runtime.py``) does not import the code generator.
"""
import importlib as _importlib

_LAZY = {"compile_aten_graph": "ember.native.backend", "DECOMPOSITIONS": "ember.native.decomp"}

__all__ = ["compile_aten_graph", "DECOMPOSITIONS"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'ember.native' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
