"""The ``openvino`` backend: captured graph -> ember's autograd layer -> OpenVINO partitions.

    ember.compile(model, backend="openvino", options={...})

Each captured graph goes through ``ember.aot.aot_autograd``, which traces it to functional ATen graphs:
one inference graph when no gradient is needed, or a forward and a backward graph otherwise. Every
ATen graph is then partitioned (partition.py): supported ops run in OpenVINO, the rest in PyTorch.

Freezing. A captured graph receives parameters and buffers as inputs. For inference graphs they are
baked into the OpenVINO models as constants (unless ``aot_autograd`` is on), which lets OpenVINO fold
batch norms into convolutions and pre-pack weights: much of its speed comes from there. A baked value
must not go stale, so every call first checks that each frozen input is the same tensor object, with
the same version counter, as when it was baked (a few attribute reads per weight). An in-place update
(``load_state_dict``, an optimizer step under ``no_grad``) changes the version: the graph is rebuilt
with the new values, and after ``MAX_REFREEZES`` rebuilds it stops freezing for good. Writes through
``.data`` bypass version counters, as they do for autograd: use ``with torch.no_grad(): p.copy_(v)``.

Dynamic shapes. A captured graph with symbolic sizes (or ints traced as symbols) is traced to ATen
graphs with the same symbols; their partitions become OpenVINO models with dynamic dimensions, compiled
once for every size (shapes.py), and the size arithmetic between them runs in Python (partition.py).
"""
from __future__ import annotations

import re

import torch
import torch.fx as fx

from ember.aot import aot_autograd
from ember.backends.openvino import decompositions, fastpath, partition
from ember.backends.openvino.convert import core
from ember.backends.openvino.options import OVOptions, check_against_runtime, resolve
from ember.backends.openvino.shapes import graph_input_positions

MAX_REFREEZES = 2
_ATTRIBUTE_SOURCE = re.compile(r"\.[A-Za-z_]\w*$")  # "self.conv.weight", "self[0].running_mean"


def openvino_backend(gm: fx.GraphModule, example_inputs: list, options: dict | None = None, mode=None):
    if mode not in (None, "default"):
        raise ValueError(f"backend 'openvino' takes no mode (got {mode!r}); tune it with options, e.g. "
                         "options={'config': {'PERFORMANCE_HINT': 'THROUGHPUT'}}")
    opts = resolve(options)
    check_against_runtime(opts, core())
    weights = weight_positions(gm, example_inputs) if opts.freeze_weights else set()
    compiler = GraphCompiler(opts, weights)
    aot = aot_autograd(fw_compiler=compiler.training, bw_compiler=compiler.training,
                       inference_compiler=compiler.inference,
                       decompositions={**decompositions.TABLE, **opts.decompositions})
    if opts.model_caching:
        return fastpath.compile_with_cache(gm, example_inputs, opts, weights, aot)
    return aot(gm, example_inputs)


def weight_positions(gm: fx.GraphModule, example_inputs: list) -> set[int]:
    """Positions, among the ATen graphs' placeholders, of parameters and buffers: inputs that are
    ``nn.Parameter`` objects or are read from a module attribute."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    positions = set()
    for rank, i in enumerate(graph_input_positions(gm, example_inputs)):
        value, source = example_inputs[i], str(placeholders[i].meta.get("source", ""))
        if isinstance(value, torch.nn.Parameter) or (isinstance(value, torch.Tensor)
                                                     and _ATTRIBUTE_SOURCE.search(source)):
            positions.add(rank)
    return positions


class GraphCompiler:
    """The ATen-graph compilers handed to ``aot_autograd``."""

    def __init__(self, opts: OVOptions, weights: set[int]):
        self.opts, self.weights = opts, weights

    def inference(self, gm: fx.GraphModule, example_inputs: list):
        return FrozenGraph(gm, list(example_inputs), self.weights, self.opts)

    def training(self, gm: fx.GraphModule, example_inputs: list):
        # forward and backward graphs: weights change at every optimizer step, so nothing is frozen
        return partition.build(gm, list(example_inputs), set(), self.opts).run


def _versioned(t) -> bool:
    try:
        t._version
    except Exception:  # noqa: BLE001 - inference-mode tensors have no version counter: never frozen
        return False
    return True


class FrozenGraph:
    """An inference graph with some inputs baked in as constants, rebuilt if they change."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list, weights: set[int], opts: OVOptions):
        self.gm, self.opts, self.rebuilds = gm, opts, 0
        self.name = f"graph{next(partition._graph_ids)}"
        self._build(example_inputs, weights)

    def _build(self, args: list, positions: set[int]) -> None:
        positions = {k for k in positions if _versioned(args[k])}
        self.frozen = [(k, args[k], args[k]._version) for k in sorted(positions)]
        self.built = partition.build(self.gm, args, positions, self.opts, self.name)
        self._run = self.built.run

    def __call__(self, *args):
        for k, t, version in self.frozen:
            if args[k] is not t or t._version != version:
                return self._weights_changed(list(args), k)
        return self._run(*args)

    def _weights_changed(self, args: list, k: int):
        self.rebuilds += 1
        positions = {pos for pos, _, _ in self.frozen}
        if self.rebuilds > MAX_REFREEZES:
            partition.log(f"{self.name}: frozen input {k} changed again; weights become runtime inputs")
            positions = set()
        else:
            partition.log(f"{self.name}: frozen input {k} changed (new tensor or in-place update); rebuilding")
        self._build(args, positions)
        return self._run(*args)
