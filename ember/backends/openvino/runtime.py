"""Running one compiled partition: tensors in, fresh tensors out, PyTorch if OpenVINO fails.

Inputs are handed to OpenVINO without a copy (``ov.Tensor(..., shared_memory=True)`` over the torch
tensor's memory; OpenVINO only reads them during ``infer``).

Outputs are written by OpenVINO straight into torch tensors we allocate and hand out, so no copy is
made either. Unlike OpenVINO's own integration, an output is never written again once it is handed
out: each output has a small pool of buffers, and a buffer is reused only when nothing outside the pool
holds its storage any more (checked with the storage's reference count: the caller's tensor, or any
view of it, keeps it busy). The usual loop ``y = model(x)`` alternates between two buffers; results
kept around make the pool allocate new ones instead.
"""
from __future__ import annotations

import torch

from ember.diagnostics import logging as elog

POOL_SIZE = 3


def _storage_refs(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class _OutputPool:
    """Buffers for one output of one infer request."""

    def __init__(self, ov, shape: tuple, dtype: torch.dtype):
        self.ov, self.shape, self.dtype = ov, shape, dtype
        self.buffers: list[tuple[torch.Tensor, object, int]] = []  # (tensor, ov.Tensor over it, idle refcount)

    def take(self):
        """(ov.Tensor to write into, the torch tensor to hand out)."""
        for buf, ov_tensor, idle in self.buffers:
            if _storage_refs(buf) == idle:
                return ov_tensor, buf.detach()  # a new TensorImpl: while the caller holds it, buf is busy
        buf = torch.empty(self.shape, dtype=self.dtype)
        ov_tensor = self.ov.Tensor(buf.numpy(), shared_memory=True)
        if len(self.buffers) < POOL_SIZE:
            self.buffers.append((buf, ov_tensor, _storage_refs(buf)))
            return ov_tensor, buf.detach()
        return ov_tensor, buf  # pool full: a one-off buffer, dropped by OpenVINO at the next call


class OVPartition(torch.nn.Module):
    """A call_module target in the partitioned graph: runs one OpenVINO compiled model.

    If OpenVINO fails at run time, ``make_fallback(fallback_graph)`` (a callable taking the same inputs)
    runs instead, for good; without ``make_fallback`` the error propagates."""

    def __init__(self, name: str, compiled, in_specs: list, out_specs: list, fallback_graph=None,
                 make_fallback=None):
        super().__init__()
        import openvino as ov

        self.name = name
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self._ov = ov
        self._casts = []
        self._pools = []
        for k, (shape, dtype) in enumerate(out_specs):
            ov_type = compiled.outputs[k].get_element_type()
            produced = _torch_dtype(ov_type, dtype)
            ov_shape = tuple(compiled.outputs[k].get_shape())
            if _numel(ov_shape) != _numel(shape):
                raise RuntimeError(f"OpenVINO output {k} has shape {ov_shape}, PyTorch expects {shape}")
            self._pools.append(_OutputPool(ov, ov_shape, produced))
            # OpenVINO may pick another integer width or a flattened shape: fix up after the call
            self._casts.append(None if (produced == dtype and ov_shape == shape) else (shape, dtype))
        self.in_dtypes = [d for _, d in in_specs]
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
        for i, a in enumerate(args):
            a = a.detach()
            if not a.is_contiguous():
                a = a.contiguous()
            req.set_input_tensor(i, ov.Tensor(a.numpy(), shared_memory=True))
        outs = []
        for k, pool in enumerate(self._pools):
            ov_tensor, out = pool.take()
            req.set_output_tensor(k, ov_tensor)
            outs.append(out)
        req.infer()
        for k, cast in enumerate(self._casts):
            if cast is not None:
                outs[k] = outs[k].reshape(cast[0]).to(cast[1])
        return tuple(outs)


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
