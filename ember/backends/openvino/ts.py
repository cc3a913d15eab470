"""The ``openvino_ts`` backend: the captured graph traced with ``torch.jit.trace``, converted whole with
``openvino.convert_model`` (OpenVINO's TorchScript frontend), run with the OpenVINO runtime.

It is the simpler, older route: no ATen tracing and no partitioning, so an op OpenVINO's TorchScript
frontend cannot convert makes the whole graph run in PyTorch (logged). Inference only: a call that
needs gradients, and graphs that write into their inputs, run the captured graph as it is.
Parameters and buffers are bound into the traced module, so OpenVINO sees them as constants; they are
checked for identity and version on every call like the ``openvino`` backend's frozen weights.
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
from ember.backends.openvino.options import check_against_runtime, resolve
from ember.backends.openvino.partition import log
from ember.backends.openvino.runtime import OVPartition
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
    opts = resolve(options)
    check_against_runtime(opts, core())
    reason = _why_not_traceable(gm, example_inputs)
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs):
        reason = "the call needs gradients (openvino_ts is inference only)"
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
        bound = {tensor_pos[r] for r in ranks}
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
        in_specs = [(tuple(a.shape), a.dtype) for a in args]
        out_specs = [(tuple(o.shape), o.dtype) for o in outs]
        self.runner = OVPartition("openvino_ts", compiled, in_specs, out_specs, module, lambda m: m.forward)
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
