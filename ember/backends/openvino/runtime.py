"""Running one compiled partition: tensors in, fresh tensors out, PyTorch if OpenVINO fails.

Inputs are handed to OpenVINO without a copy (``ov.Tensor(..., shared_memory=True)`` over the torch
tensor's memory; OpenVINO only reads them during ``infer``). Int inputs (sizes, under dynamic shapes)
are written into a 0-d array that OpenVINO reads in place.

Outputs are written by OpenVINO straight into torch tensors we allocate and hand out, so no copy is
made either. Unlike OpenVINO's own integration, an output is never written again once it is handed
out: each output has a small pool of buffers, and a buffer is reused only when nothing outside the pool
holds its storage any more (checked with the storage's reference count: the caller's tensor, or any
view of it, keeps it busy). The usual loop ``y = model(x)`` alternates between two buffers; results
kept around make the pool allocate new ones instead. Under dynamic shapes each call's output sizes
are worked out from its input sizes first (``shapes.Signature.output_shapes``); an output whose sizes
cannot be (rare) is copied out of OpenVINO's own buffer instead.

Outputs that are inputs. When OpenVINO's compiled graph feeds a result straight from a parameter (an
``aten.alias`` of an input, or an op it optimized away, as a backward graph often returns), the CPU
plugin mishandles a caller-set output tensor on that port: it leaves the output unwritten and may even
write the output buffer's garbage over the input and over everything computed from it (OpenVINO
2026.4; it made a Llama's gradients NaN). Such ports (read off ``get_runtime_model()``) are never given
our buffer: OpenVINO's own output tensor, which shares the input's memory, is copied out instead.

Threads. An infer request runs one inference at a time and holds that inference's inputs and
outputs, so concurrent calls must not share one ("Infer Request is busy", or one thread's inputs
under another's results). Each partition keeps a free list of requests, each with its own int arrays
and output pools: a call takes an idle one (creating it when every request is busy, so there are at
most as many as calls ever ran at once) and puts it back when done.
"""
from __future__ import annotations

import torch

from ember.backends.openvino.shapes import Signature, Spec
from ember.diagnostics import logging as elog

POOL_SIZE = 3


def _storage_refs(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class _OutputPool:
    """Buffers for one output of one infer request. Under dynamic shapes a call may need another size:
    a buffer is reused only for its own size, and an idle buffer of another size makes room."""

    def __init__(self, ov, dtype: torch.dtype):
        self.ov, self.dtype = ov, dtype
        self.buffers: list[tuple[torch.Tensor, object, int]] = []  # (tensor, ov.Tensor over it, idle refcount)

    def take(self, shape: tuple):
        """(ov.Tensor to write into, the torch tensor to hand out)."""
        spare = None
        for k, (buf, ov_tensor, idle) in enumerate(self.buffers):
            if _storage_refs(buf) == idle:
                if buf.shape == shape:
                    return ov_tensor, buf.detach()  # a new TensorImpl: while the caller holds it, buf is busy
                spare = k
        buf = torch.empty(shape, dtype=self.dtype)
        ov_tensor = self.ov.Tensor(buf.numpy(), shared_memory=True)
        entry = (buf, ov_tensor, _storage_refs(buf))
        if len(self.buffers) < POOL_SIZE:
            self.buffers.append(entry)
        elif spare is not None:
            self.buffers[spare] = entry  # sizes changed: an idle buffer of an old size goes
        else:
            return ov_tensor, buf  # pool full: a one-off buffer, dropped by OpenVINO at the next call
        return ov_tensor, buf.detach()


class _Output:
    """How one output comes out of OpenVINO: written into a pooled buffer of a known shape (static, or
    worked out from the call's input sizes), else copied out of OpenVINO's own buffer; then fixed up
    when OpenVINO chose another integer width or a flattened shape."""

    def __init__(self, port, spec: Spec, computable: bool, from_input: bool):
        self.spec = spec
        self.produced = _torch_dtype(port.get_element_type(), spec.dtype)
        pshape = port.get_partial_shape()
        self.buffer_shape = None  # None: the shape PyTorch expects at this call
        if pshape.is_static:
            self.buffer_shape = tuple(pshape.to_shape())
            if not spec.symbolic and _numel(self.buffer_shape) != _numel(spec.shape):
                raise RuntimeError(f"OpenVINO output has shape {self.buffer_shape}, PyTorch expects {spec.shape}")
            reshaped = self.buffer_shape != spec.shape
        else:
            reshaped = pshape.rank.is_static and pshape.rank.get_length() != len(spec.shape)
        if reshaped and not computable:
            raise RuntimeError(f"OpenVINO output has shape {pshape}, PyTorch expects {spec.text()}, whose "
                               "sizes cannot be worked out from the inputs")
        # no pool: OpenVINO's buffer is copied (a port fed by an input, a reshaped dynamic output,
        # sizes unknown beforehand)
        known = self.buffer_shape is not None or (computable and not reshaped)
        self.pooled = known and not from_input
        self.reshaped, self.cast = reshaped, self.produced != spec.dtype


def outputs_fed_by_inputs(compiled) -> set[int] | None:
    """Output positions that OpenVINO's compiled graph feeds straight from a parameter (see the module
    docstring); None when the device has no runtime model to tell (then every output is copied)."""
    try:
        results = compiled.get_runtime_model().get_results()
        kinds = [r.input_value(0).get_node().get_rt_info()["layerType"].astype(str) for r in results]
    except Exception:  # noqa: BLE001 - a plugin without runtime-model introspection
        return None
    if len(kinds) != len(compiled.outputs):
        return None
    return {k for k, kind in enumerate(kinds) if kind in _INPUT_LAYERS}


_INPUT_LAYERS = {"Input", "Parameter"}  # the CPU plugin's runtime-model names of a model parameter


class _Request:
    """One infer request and what only it may touch: its int-input arrays and its output pools.
    Used by one call at a time (OVPartition's free list)."""

    def __init__(self, part: "OVPartition"):
        import numpy as np

        ov = part._ov
        self.request = part.compiled.create_infer_request()
        self.pools = [_OutputPool(ov, out.produced) if out.pooled else None for out in part._outputs]
        self.ints = {}  # an int input is written into a 0-d array that OpenVINO reads in place
        for k, spec in enumerate(part.signature.inputs):
            if spec.is_int:
                self.ints[k] = np.zeros((), dtype=np.int64)
                self.request.set_input_tensor(k, ov.Tensor(self.ints[k], shared_memory=True))

    def run(self, part: "OVPartition", args) -> tuple:
        req, ov = self.request, part._ov
        copies = []  # contiguous copies of inputs: the request does not keep them alive until infer()
        for i, a in enumerate(args):
            if i in self.ints:
                self.ints[i][()] = a
                continue
            a = a.detach()
            if not a.is_contiguous():
                a = a.contiguous()
                copies.append(a)
            req.set_input_tensor(i, ov.Tensor(a.numpy(), shared_memory=True))
        shapes = part._output_shapes(args) if part._output_shapes is not None else None
        outs = []
        for k, out in enumerate(part._outputs):
            if self.pools[k] is None:
                outs.append(None)
                continue
            shape = out.buffer_shape if out.buffer_shape is not None else _expected(out.spec, shapes, k)
            ov_tensor, t = self.pools[k].take(shape)
            req.set_output_tensor(k, ov_tensor)
            outs.append(t)
        req.infer()
        for k, out in enumerate(part._outputs):
            if outs[k] is None:  # OpenVINO's own buffer (or an input's memory), which a later call overwrites
                outs[k] = torch.from_numpy(req.get_output_tensor(k).data.copy())
            if out.reshaped:
                outs[k] = outs[k].reshape(_expected(out.spec, shapes, k))
            if out.cast:
                outs[k] = outs[k].to(out.spec.dtype)
        return tuple(outs)


class OVPartition(torch.nn.Module):
    """A call_module target in the partitioned graph: runs one OpenVINO compiled model.

    ``signature`` (shapes.py) says what it takes and returns; tensor inputs may have symbolic sizes,
    and int inputs (sizes computed in the PyTorch glue) go in as 0-d int64 tensors. If OpenVINO fails
    at run time, ``make_fallback(fallback_graph)`` (a callable taking the same inputs) runs instead,
    for good; without ``make_fallback`` the error propagates. Safe to call from several threads."""

    def __init__(self, name: str, compiled, signature: Signature, fallback_graph=None, make_fallback=None):
        super().__init__()
        import openvino as ov

        self.name = name
        self.compiled = compiled
        self.signature = signature
        self._ov = ov
        shapes = signature.output_shapes() if any(s.symbolic for s in signature.outputs) else None
        fed = outputs_fed_by_inputs(compiled)
        if fed is None:
            elog.artifact("openvino", f"{name}: the device shows no runtime graph to tell outputs that are "
                                      "inputs passed through; every output is copied out of OpenVINO's buffers")
        elif fed:
            elog.artifact("openvino", f"{name}: output(s) {sorted(fed)} are inputs passed through; copied out")
        self._outputs = [_Output(compiled.outputs[k], spec, shapes is None or shapes.known[k],
                                 fed is None or k in fed)
                         for k, spec in enumerate(signature.outputs)]
        self._output_shapes = shapes
        # idle requests; list.append/pop are atomic under the GIL, so taking one needs no lock
        self._idle = [_Request(self)]
        self.fallback_graph = fallback_graph
        self._make_fallback = make_fallback
        self.fallback = None

    @property
    def requests(self) -> int:
        """How many idle infer requests the partition holds (all of them between calls)."""
        return len(self._idle)

    def forward(self, *args):
        if self.fallback is not None:
            return self.fallback(*args)
        if self._make_fallback is None:
            return self._infer(args)
        try:
            return self._infer(args)
        except Exception as exc:  # noqa: BLE001 - any OpenVINO runtime error: PyTorch gives the right answer
            self.use_fallback(f"OpenVINO inference failed: {type(exc).__name__}: {exc}")
            return self.fallback(*args)

    def use_fallback(self, reason: str) -> None:
        elog.artifact("openvino", f"{self.name}: runs in PyTorch from now on; {reason}")
        self.fallback = self._make_fallback(self.fallback_graph)
        self._idle = []

    def _infer(self, args):
        try:
            request = self._idle.pop()
        except IndexError:  # every request is in use by another thread (or this is the first call)
            request = _Request(self)
        try:
            return request.run(self, args)
        finally:
            self._idle.append(request)


def _expected(spec: Spec, shapes, k: int) -> tuple:
    """The shape PyTorch expects of output ``k`` at this call."""
    return shapes[k] if spec.symbolic else spec.shape


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


_OV_TO_TORCH = {"f32": torch.float32, "f16": torch.float16, "i64": torch.int64, "i32": torch.int32,
                "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8, "boolean": torch.bool}


def _torch_dtype(ov_type, expected: torch.dtype) -> torch.dtype:
    dtype = _OV_TO_TORCH.get(ov_type.get_type_name())
    if dtype is None:
        raise RuntimeError(f"OpenVINO produces {ov_type}, which has no torch dtype here")
    return dtype
