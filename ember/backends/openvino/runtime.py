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

    def __init__(self, ov, port, spec: Spec, computable: bool):
        self.spec = spec
        produced = _torch_dtype(port.get_element_type(), spec.dtype)
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
        # no pool: OpenVINO allocates and we copy (a reshaped dynamic output, or sizes unknown beforehand)
        known = self.buffer_shape is not None or (computable and not reshaped)
        self.pool = _OutputPool(ov, produced) if known else None
        self.reshaped, self.cast = reshaped, produced != spec.dtype


class OVPartition(torch.nn.Module):
    """A call_module target in the partitioned graph: runs one OpenVINO compiled model.

    ``signature`` (shapes.py) says what it takes and returns; tensor inputs may have symbolic sizes,
    and int inputs (sizes computed in the PyTorch glue) go in as 0-d int64 tensors. If OpenVINO fails
    at run time, ``make_fallback(fallback_graph)`` (a callable taking the same inputs) runs instead,
    for good; without ``make_fallback`` the error propagates."""

    def __init__(self, name: str, compiled, signature: Signature, fallback_graph=None, make_fallback=None):
        super().__init__()
        import numpy as np
        import openvino as ov

        self.name = name
        self.compiled = compiled
        self.signature = signature
        self.request = compiled.create_infer_request()
        self._ov = ov
        shapes = signature.output_shapes() if any(s.symbolic for s in signature.outputs) else None
        self._outputs = [_Output(ov, compiled.outputs[k], spec, shapes is None or shapes.known[k])
                         for k, spec in enumerate(signature.outputs)]
        self._output_shapes = shapes
        # an int input is written into a 0-d array that OpenVINO reads in place
        self._ints = {}
        for k, spec in enumerate(signature.inputs):
            if spec.is_int:
                self._ints[k] = np.zeros((), dtype=np.int64)
                self.request.set_input_tensor(k, ov.Tensor(self._ints[k], shared_memory=True))
        self.fallback_graph = fallback_graph
        self._make_fallback = make_fallback
        self.fallback = None

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
        self.request = None

    def _infer(self, args):
        req, ov = self.request, self._ov
        copies = []  # contiguous copies of inputs: the request does not keep them alive until infer()
        for i, a in enumerate(args):
            if i in self._ints:
                self._ints[i][()] = a
                continue
            a = a.detach()
            if not a.is_contiguous():
                a = a.contiguous()
                copies.append(a)
            req.set_input_tensor(i, ov.Tensor(a.numpy(), shared_memory=True))
        shapes = self._output_shapes(args) if self._output_shapes is not None else None
        outs = []
        for k, out in enumerate(self._outputs):
            if out.pool is None:
                outs.append(None)
                continue
            shape = out.buffer_shape if out.buffer_shape is not None else _expected(out.spec, shapes, k)
            ov_tensor, t = out.pool.take(shape)
            req.set_output_tensor(k, ov_tensor)
            outs.append(t)
        req.infer()
        for k, out in enumerate(self._outputs):
            if outs[k] is None:  # OpenVINO's own buffer, which its next call overwrites: copy it out
                outs[k] = torch.from_numpy(req.get_output_tensor(k).data.copy())
            if out.reshaped:
                outs[k] = outs[k].reshape(_expected(out.spec, shapes, k))
            if out.cast:
                outs[k] = outs[k].to(out.spec.dtype)
        return tuple(outs)


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
