"""ember's ahead-of-time autograd layer: turn a forward-only graph compiler into a training backend.

    backend = aot_autograd(fw_compiler=my_compiler)      # my_compiler(aten_gm, example_inputs) -> callable
    model = ember.compile(model, backend=backend)

For each captured graph the layer traces ATen-level, functional graphs with ``make_fx`` (decomposed with
``default_decompositions()`` plus ``decompositions``): the forward alone when no gradient is needed, or
the joint forward+backward graph, split by ``partition_fn`` (``min_cut_partition`` by default) into a
forward and a backward graph that run inside one ``torch.autograd.Function``. Mutated inputs, outputs
aliasing inputs or each other, and non-tensor outputs are handled around the compiled graphs, so a
compiled call behaves like the eager one. ``EMBER_LOGS=aot_graphs`` prints every graph it builds.
"""
from __future__ import annotations

from typing import Callable

from ember.aot.ops import decomposition_table, default_decompositions
from ember.aot.partition import PartitionSummary, default_partition, min_cut_partition
from ember.aot.pipeline import AOTCompiledGraph, AOTOptions
from ember.aot.runtime import boxed

__all__ = ["aot_autograd", "default_decompositions", "min_cut_partition", "default_partition",
           "PartitionSummary", "AOTCompiledGraph", "run_graph_eagerly"]


def run_graph_eagerly(gm, example_inputs):
    """The trivial graph compiler: run the ATen graph as Python. Boxed, so inputs are freed at their
    last use, and dead buffers are reused by in-place ops: the memory profile of eager autograd."""
    return boxed(gm, reinplace=True)


def aot_autograd(fw_compiler: Callable | None = None, bw_compiler: Callable | None = None, *,
                 decompositions: dict | None = None, partition_fn: Callable | None = None,
                 inference_compiler: Callable | None = None, strict: bool = False) -> Callable:
    """A backend ``fn(gm, example_inputs) -> callable`` that trains.

    Args:
        fw_compiler: compiles the forward graph (ATen fx graph, example inputs) -> callable returning a
            tuple. Defaults to running the graph eagerly.
        bw_compiler: compiles the backward graph; defaults to ``fw_compiler``.
        decompositions: op -> function entries added to (or overriding) ``default_decompositions()``;
            op -> None takes the op out (it reaches the compilers whole).
        partition_fn: ``fn(joint_gm, joint_inputs, *, num_fwd_outputs) -> (fw_gm, bw_gm)``; defaults to
            ``min_cut_partition``.
        inference_compiler: compiles forward-only graphs (no gradient needed); defaults to ``fw_compiler``.
        strict: raise if a graph cannot be traced (data-dependent shapes, an op functionalization does
            not support...). By default such a graph runs eagerly, with a warning: slower, never wrong.
    """
    fw = fw_compiler or run_graph_eagerly
    options = AOTOptions(
        fw_compiler=fw,
        bw_compiler=bw_compiler or fw,
        inference_compiler=inference_compiler or fw,
        partition_fn=partition_fn or min_cut_partition,
        decompositions=decomposition_table(decompositions),
        strict=strict,
    )

    def backend(gm, example_inputs):
        return AOTCompiledGraph(gm, list(example_inputs), options)

    backend.options = options
    backend.__name__ = f"aot_autograd({getattr(fw, '__name__', 'compiler')})"
    return backend
