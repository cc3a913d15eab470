"""The ``openvino_ts`` backend: the captured graph traced with ``torch.jit.trace``, converted whole with
``openvino.convert_model`` (OpenVINO's TorchScript frontend), run with the OpenVINO runtime.

It is the simpler, older route: no ATen tracing and no partitioning, so an op OpenVINO's TorchScript
frontend cannot convert makes the whole graph run in PyTorch (logged). Inference only: a call that
needs gradients, and graphs that write into their inputs, run the captured graph as it is.
Parameters and buffers are bound into the traced module, so OpenVINO sees them as constants; they are
checked for identity and version on every call like the ``openvino`` backend's frozen weights.
Under dynamic shapes each concrete input shape gets its own trace (``PerShapeGraph``).
"""
from __future__ import annotations

import operator
import time
import warnings

import torch
import torch.fx as fx

from ember.backends.openvino import cache
from ember.backends.openvino.backend import weight_positions
from ember.backends.openvino.convert import _import_openvino, core
from ember.backends.openvino.options import OpenVINOTSOptions, check_against_runtime, resolve
from ember.backends.openvino.partition import log
from ember.backends.openvino.runtime import OVPartition
from ember.backends.openvino.shapes import Signature, graph_input_positions
from ember.backends.openvino.support import is_symbolic
from ember.backends.openvino.threads import compile_config




class _Bound(torch.nn.Module):
    """The captured graph with its weights (and non-tensor inputs) bound: forward takes the rest."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list, bound: set[int]):
        super().__init__()
        self.gm = gm
        self.slots = []  # per graph input: ("arg", k) | ("weight", name) | ("value", v)
        for i, value in enumerate(example_inputs):
            if i in bound:
                name = f"w{i}"
                self.register_buffer(name, value.detach())
                self.slots.append(("weight", name))
            elif isinstance(value, torch.Tensor):
                self.slots.append(("arg", None))
            else:
                self.slots.append(("value", value))

    def forward(self, *args):
        it = iter(args)
        full = [next(it) if kind == "arg" else getattr(self, v) if kind == "weight" else v for kind, v in self.slots]
        return tuple(self.gm(*full))


_IN_PLACE_OPERATORS = {getattr(operator, n) for n in (
    "iadd isub imul itruediv ifloordiv imod ipow iand ior ixor ilshift irshift imatmul setitem").split()}


def _why_not_traceable(gm: fx.GraphModule, example_inputs: list) -> str | None:
    """Why the TorchScript route would change the graph's meaning (OpenVINO never writes back into
    inputs or returns them as they are), or None."""
    for node in gm.graph.nodes:
        name = getattr(node.target, "__name__", str(node.target))
        if node.op in ("call_function", "call_method") and (
                (name.endswith("_") and not name.endswith("__")) or node.target in _IN_PLACE_OPERATORS):
            return f"it writes in place ({name})"
        if node.kwargs.get("inplace") or "out" in node.kwargs:
            return f"it writes in place ({name})"
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    if any(not isinstance(a, fx.Node) or a.op == "placeholder" for a in flat):
        return "it returns an input or a non-tensor value"
    return None


def openvino_ts(gm: fx.GraphModule, example_inputs: list, options: dict | None = None, mode=None):
    if mode not in (None, "default"):
        raise ValueError(f"backend 'openvino_ts' takes no mode (got {mode!r})")
    opts = resolve(OpenVINOTSOptions.from_dict(options))
    check_against_runtime(opts, core())
    reason = _why_not_traceable(gm, example_inputs)
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs):
        reason = "the call needs gradients (openvino_ts is inference only)"
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if reason is None and any(is_symbolic(n.meta.get("example_value")) for n in placeholders):
        return PerShapeGraph(gm, opts)
    if reason is None:
        try:
            return TracedGraph(gm, example_inputs, opts)
        except Exception as exc:  # noqa: BLE001 - tracing or conversion failed: PyTorch is still right
            reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    log(f"openvino_ts: the graph runs in PyTorch: {reason}")
    return gm.forward


class TracedGraph:
    def __init__(self, gm: fx.GraphModule, example_inputs: list, opts):
        ov, _, _ = _import_openvino()
        t0 = time.perf_counter()
        self.gm = gm
        tensor_pos = [i for i, a in enumerate(example_inputs) if isinstance(a, torch.Tensor)]
        ranks = weight_positions(gm, example_inputs) if opts.freeze_weights else set()
        bound = {graph_input_positions(gm, example_inputs)[r] for r in ranks}
        self.args_pos = [i for i in tensor_pos if i not in bound]
        self.frozen = [(i, example_inputs[i], example_inputs[i]._version) for i in sorted(bound)]
        self.grad_pos = tensor_pos
        module = _Bound(gm, example_inputs, bound).eval()
        args = tuple(example_inputs[i].detach() for i in self.args_pos)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is this backend's documented route
            traced = torch.jit.trace(module, args, check_trace=False, strict=False)
            outs = module(*args)
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise TypeError("the graph returns non-tensor values")
        model = ov.convert_model(traced, example_input=args)
        # the TorchScript frontend leaves dimensions dynamic; the captured graph's shapes are static
        model.reshape({model.inputs[k]: ov.PartialShape(list(a.shape)) for k, a in enumerate(args)})
        config = compile_config(opts)
        if opts.model_caching and "CACHE_DIR" not in config:
            config["CACHE_DIR"] = cache.blob_dir(opts.cache_dir)
        compiled = core().compile_model(model, opts.device, config)
        self.runner = OVPartition("openvino_ts", compiled, Signature.of(list(args), list(outs)), module,
                                  lambda m: m.forward)
        log(f"openvino_ts: traced, converted and compiled in {time.perf_counter() - t0:.3f}s")

    def __call__(self, *args):
        if torch.is_grad_enabled() and any(args[i].requires_grad for i in self.grad_pos):
            return self.gm(*args)  # inference only: autograd needs the PyTorch graph
        for i, t, version in self.frozen:
            if args[i] is not t or t._version != version:
                log("openvino_ts: a weight changed since it was traced; running in PyTorch from now on")
                self.frozen, self.runner = [], None
                break
        if self.runner is None:
            return self.gm(*args)
        return self.runner(*[args[i] for i in self.args_pos])


class PerShapeGraph:
    """A graph with symbolic sizes (dynamic shapes). A TorchScript trace is static (sizes used in
    Python arithmetic become constants), so each concrete set of input shapes and int values gets its
    own traced graph, built at its first call; past ``MAX_SHAPES`` of them the graph runs in PyTorch."""

    MAX_SHAPES = 8

    def __init__(self, gm: fx.GraphModule, opts):
        self.gm, self.opts, self.graphs = gm, opts, {}

    def __call__(self, *args):
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        graph = self.graphs.get(key)
        if graph is None:
            if len(self.graphs) >= self.MAX_SHAPES:
                log(f"openvino_ts: more than {self.MAX_SHAPES} input shapes; new ones run in PyTorch")
                return self.gm(*args)
            try:
                graph = TracedGraph(self.gm, list(args), self.opts)
            except Exception as exc:  # noqa: BLE001 - tracing or conversion failed: PyTorch is still right
                log(f"openvino_ts: the graph runs in PyTorch for these shapes: {type(exc).__name__}: {exc}")
                graph = self.gm.forward
            self.graphs[key] = graph
        return graph(*args)
