"""Large CPU buffers kept across calls of a generated wrapper (the C++ path's ``empty_strided``).

A fresh CPU buffer of tens of MiB comes from ``mmap`` (glibc serves blocks above its mmap threshold,
at most 32 MiB, that way), so every call page-faults it in again: on the development VM a 32 MiB
softmax output costs ~11 ms of faults against ~2.5 ms of copying (eager and torch.compile pay the
same). A ``BufferPool`` is one allocation site of the wrapper: it keeps the storages of the last few
buffers it handed out, and hands one out again only when nothing else holds it any more (its use
count is the pool's own reference alone: no tensor, view, autograd record or storage object of the
caller's refers to it). A buffer the caller still holds is never reused, so results are never
overwritten; memory kept is at most ``KEEP`` buffers of the site's size. Only graph results are
pooled (wrapper._alloc): an intermediate dies inside the call, and keeping it would hold memory eager
returns between calls.
"""
from __future__ import annotations

import threading

import torch

# buffers at least this large are pooled (smaller ones come from the heap, with no page faults once
# malloc's threshold has adapted)
POOL_MIN_BYTES = 16 << 20
KEEP = 2  # a caller holding the previous result while the next call runs still finds one free
_use_count = getattr(torch._C, "_storage_Use_Count", None)


class BufferPool:
    __slots__ = ("sizes", "strides", "dtype", "nbytes", "kept", "lock")

    def __init__(self, sizes, strides, dtype):
        self.sizes, self.strides, self.dtype = tuple(sizes), tuple(strides), dtype
        span = 1 + sum((n - 1) * s for n, s in zip(self.sizes, self.strides)) if all(self.sizes) else 0
        self.nbytes = span * torch.empty((), dtype=dtype).element_size()
        self.kept: list = []
        self.lock = threading.Lock()

    def __call__(self) -> torch.Tensor:
        with self.lock:  # two threads calling the same graph never get the same free storage
            for s in self.kept:
                if _use_count(s._cdata) == 1 and s.nbytes() >= self.nbytes:
                    return torch.empty(0, dtype=self.dtype).set_(s, 0, self.sizes, self.strides)
            t = torch.empty_strided(self.sizes, self.strides, dtype=self.dtype)
            if len(self.kept) < KEEP:
                self.kept.append(t.untyped_storage())
            return t


def pooled(sizes, strides, dtype, device) -> bool:
    """Whether the wrapper allocates this buffer through a BufferPool."""
    if _use_count is None or torch.device(device).type != "cpu":
        return False
    if not all(isinstance(v, int) for v in (*sizes, *strides)):
        return False
    span = 1 + sum((n - 1) * s for n, s in zip(sizes, strides)) if all(sizes) else 0
    return span * torch.empty((), dtype=dtype).element_size() >= POOL_MIN_BYTES
