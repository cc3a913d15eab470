"""ember's native backend: ATen FX graphs -> fused Triton kernels and a Python wrapper.

``compile_aten_graph(gm, example_inputs)`` compiles a graph that ``make_fx`` produced with
``DECOMPOSITIONS`` applied (functionalized), with static or symbolic sizes (dynamic shapes: the
kernels then take their sizes as arguments). See ``backend.py`` for the pipeline.
"""
from ember.native.backend import compile_aten_graph as compile_aten_graph
from ember.native.decomp import DECOMPOSITIONS as DECOMPOSITIONS

__all__ = ["compile_aten_graph", "DECOMPOSITIONS"]
