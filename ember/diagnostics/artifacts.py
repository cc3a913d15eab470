"""The names of ember's log artifacts (``EMBER_LOGS``), apart from the loggers, so that
``ember.config`` can reject an unknown name when it is set without importing the logging setup."""
from __future__ import annotations

ARTIFACTS = {
    "graph_breaks": "each graph break or whole-frame fallback, with its reason and user file:line",
    "recompiles": "each cache miss that recompiles, naming the first failing guard",
    "guards": "the generated guard code of each new cache entry",
    "graph_code": "the captured FX graph of each compile",
    "output_code": "generated code: each entry function (guards, input loads, graph call, output rebuild), each "
                   "graph-break function, and the native backend's wrapper and Triton kernels",
    "aot_graphs": "the ATen graphs of the autograd layer: forward/backward (with what the partitioner saved or "
                  "recomputed, and why), inference, input/output handling",
    "cudagraphs": "CUDA graphs: default mode's choice per graph (estimated or measured, with the numbers), "
                  "graphs skipped, recorded, or no longer used and why",
    "openvino": "the openvino backends: partitions, ops kept in PyTorch and why, conversion, cache, fallbacks",
    "bytecode": "every bytecode instruction as the symbolic interpreter runs it (very verbose)",
}


def unknown_artifacts(logs: str) -> list[str]:
    """The names in the comma list ``logs`` that are neither an artifact nor ``all``."""
    names = {n.strip() for n in logs.split(",") if n.strip()}
    return sorted(names - set(ARTIFACTS) - {"all"})
